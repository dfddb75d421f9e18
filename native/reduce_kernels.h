// reduce_kernels.h — element-wise reduction of one buffer into another for
// every DataType and ReduceOp, plus scaling. fp16/bf16 data is reduced by
// converting each element to fp32, combining, and rounding back once.
// Pure functions: no MPI, no configuration.
#pragma once

#include <cstddef>

#include "common.h"

namespace gradflow {

// dst[i] = dst[i] (op) src[i] for i < count. kAverage reduces as kSum (the
// caller divides once at the end). kBool supports kMin (and) / kMax (or).
// Throws GradflowError for unsupported (dtype, op) pairs.
void reduce_into(void* dst, const void* src, size_t count, DataType dt, ReduceOp op);

// dst[i] = a[i] (op) b[i], out of place (dst overlaps neither): bit for bit
// what copying `a` to `dst` and reduce_into(dst, b) gives, in one pass
// instead of two for float32/float64 sums (an out-of-place allreduce's
// case); other (dtype, op) pairs copy, then reduce.
void reduce_into_from(void* dst, const void* a, const void* b, size_t count, DataType dt,
                      ReduceOp op);

// buf[i] *= factor. Floating types multiply in their own precision (fp16/bf16
// via fp32, the factor rounded to float); integer types follow Horovod: the
// product in double, truncated toward zero (saturating out of range). bool
// cannot be scaled. No-op if factor == 1, for every dtype.
void scale_buffer(void* buf, size_t count, DataType dt, double factor);

// buf[i] = the identity of `op` (0 for sum/average, +inf / the type's
// largest value / true for min, -inf / smallest / false for max, 1 for
// product): what a rank that has joined contributes, so that it changes no
// result (zeros made min/max/product of the working ranks 0).
void fill_identity(void* buf, size_t count, DataType dt, ReduceOp op);

// Whether (dt, op) is supported by reduce_into; `why` explains a refusal.
bool reduce_supported(DataType dt, ReduceOp op, std::string* why);

}  // namespace gradflow
