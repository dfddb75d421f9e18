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

// buf[i] *= factor. Floating types multiply in their own precision (fp16/bf16
// via fp32, the factor rounded to float); integer types follow Horovod: the
// product in double, truncated toward zero (saturating out of range). bool
// cannot be scaled. No-op if factor == 1, for every dtype.
void scale_buffer(void* buf, size_t count, DataType dt, double factor);

// Whether (dt, op) is supported by reduce_into; `why` explains a refusal.
bool reduce_supported(DataType dt, ReduceOp op, std::string* why);

}  // namespace gradflow
