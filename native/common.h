// common.h — vocabulary types shared by every native file: data types, reduce
// ops, collective kinds, the wire dtype, the error type and check macros.
// Must not include mpi.h, pybind11 or anything that reads configuration.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradflow {

// Seconds elapsed since `t` (the stats and timeline timers of every file).
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
// A steady-clock reading in seconds (for differences: CPU-time accounting
// of the executor's codec and sparse passes).
inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
// `n` rounded up to a multiple of 64 bytes (cache-line aligned scratch parts).
inline size_t align64(size_t n) { return (n + 63) & ~size_t{63}; }

// Element types the core can move and reduce. Values are part of the Python
// ABI (gradflow/_dtypes.py maps numpy dtypes to them): append only.
enum class DataType : int32_t {
  kUInt8 = 0,
  kInt32 = 1,
  kInt64 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kFloat32 = 5,
  kFloat64 = 6,
  kBool = 7,
  kInt8 = 8,
  kInt16 = 9,
  kUInt16 = 10,
};

enum class ReduceOp : int32_t {
  kSum = 0,
  kAverage = 1,
  kMin = 2,
  kMax = 3,
  kProduct = 4,
  // Not element-wise: the scale-invariant pairwise combination of
  // adasum_allreduce.h. Allreduce only; reduce_into refuses it.
  kAdasum = 5,
};

enum class OpKind : int32_t {
  kAllreduce = 0,
  kAllgather = 1,
  kBroadcast = 2,
  kReducescatter = 3,
  kAlltoall = 4,
  kBarrier = 5,
  kJoin = 6,
};

// How float32 payloads travel. kNative sends the buffer's own dtype.
enum class WireDtype : int32_t {
  kNative = 0,
  kFloat16 = 1,
  kBFloat16 = 2,
};

// Allreduce algorithm; kAuto resolves per message (ResponseExecutor::choose_algo).
enum class AllreduceAlgo : int32_t {
  kRing = 0,
  kTwoSync = 1,
  kMpi = 2,
  kAuto = 3,
  kRecursiveDoubling = 4,
  kHalvingDoubling = 5,
};

size_t dtype_size(DataType dt);
const char* dtype_name(DataType dt);
const char* reduce_op_name(ReduceOp op);
const char* op_kind_name(OpKind kind);
const char* wire_dtype_name(WireDtype w);
const char* allreduce_algo_name(AllreduceAlgo a);
bool is_floating(DataType dt);

// Every error that reaches Python is a GradflowError; pybind11 translates it
// to gradflow.GradflowError (a RuntimeError).
class GradflowError : public std::runtime_error {
 public:
  explicit GradflowError(const std::string& what) : std::runtime_error(what) {}
};

// Bad arguments refused where they were given (Runtime::submit): Python sees
// gradflow.GradflowValueError, both a GradflowError and a ValueError.
class InvalidArgumentError : public GradflowError {
 public:
  using GradflowError::GradflowError;
};

// The transport failed (a peer dead or stalled past GRADFLOW_TIMEOUT, an MPI
// error). Only this kind of error is fatal for the background loop; any
// other error while executing an agreed response fails that response's
// handles and the runtime goes on (BackgroundLoop::cycle).
class TransportError : public GradflowError {
 public:
  using GradflowError::GradflowError;
};

std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace gradflow

// GF_CHECK_AS(ErrorType, cond, stream-expression): throw ErrorType (a
// GradflowError) with the streamed message unless `cond` holds. The two
// checks below differ only in the error type Python sees.
#define GF_CHECK_AS(ErrorType, cond, msg)          \
  do {                                             \
    if (!(cond)) {                                 \
      std::ostringstream gf_check_os_;             \
      gf_check_os_ << msg;                         \
      throw ErrorType(gf_check_os_.str());         \
    }                                              \
  } while (0)

// GF_CHECK(cond, stream-expression): throw GradflowError with a message.
#define GF_CHECK(cond, msg) GF_CHECK_AS(::gradflow::GradflowError, cond, msg)

// GF_CHECK_ARG(cond, stream-expression): throw InvalidArgumentError.
#define GF_CHECK_ARG(cond, msg) GF_CHECK_AS(::gradflow::InvalidArgumentError, cond, msg)
