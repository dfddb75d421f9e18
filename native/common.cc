// common.cc — names and sizes of the vocabulary types in common.h.
#include "common.h"

namespace gradflow {

size_t dtype_size(DataType dt) {
  switch (dt) {
    case DataType::kUInt8: return 1;
    case DataType::kBool: return 1;
    case DataType::kInt8: return 1;
    case DataType::kInt16: return 2;
    case DataType::kUInt16: return 2;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
  }
  throw GradflowError("unknown dtype code " + std::to_string(static_cast<int>(dt)));
}

const char* dtype_name(DataType dt) {
  switch (dt) {
    case DataType::kUInt8: return "uint8";
    case DataType::kBool: return "bool";
    case DataType::kInt8: return "int8";
    case DataType::kInt16: return "int16";
    case DataType::kUInt16: return "uint16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
  }
  return "unknown";
}

bool is_floating(DataType dt) {
  return dt == DataType::kFloat16 || dt == DataType::kBFloat16 || dt == DataType::kFloat32 ||
         dt == DataType::kFloat64;
}

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProduct: return "product";
    case ReduceOp::kAdasum: return "adasum";
  }
  return "unknown";
}

const char* op_kind_name(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kReducescatter: return "reducescatter";
    case OpKind::kAlltoall: return "alltoall";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kJoin: return "join";
  }
  return "unknown";
}

const char* wire_dtype_name(WireDtype w) {
  switch (w) {
    case WireDtype::kNative: return "fp32";
    case WireDtype::kFloat16: return "fp16";
    case WireDtype::kBFloat16: return "bf16";
  }
  return "unknown";
}

const char* allreduce_algo_name(AllreduceAlgo a) {
  switch (a) {
    case AllreduceAlgo::kRing: return "ring";
    case AllreduceAlgo::kTwoSync: return "two-sync";
    case AllreduceAlgo::kMpi: return "mpi";
    case AllreduceAlgo::kAuto: return "auto";
    case AllreduceAlgo::kRecursiveDoubling: return "recursive-doubling";
    case AllreduceAlgo::kHalvingDoubling: return "halving-doubling";
  }
  return "unknown";
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace gradflow
