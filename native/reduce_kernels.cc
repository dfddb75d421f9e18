// reduce_kernels.cc — dst (op)= src for every DataType x ReduceOp, and in-place
// scaling. Owns the support table (which pairs are refused and why). Pure
// element-wise loops: no MPI, no configuration, no allocation on the heap.
//
// Semantics, chosen so that reduction order (ring position) never matters:
// - integer sum/product wrap around (computed unsigned, so no signed-overflow UB);
// - floating min/max propagate NaN and order -0 < +0, so they are commutative;
// - fp16/bf16 are widened to fp32, combined, and rounded once. fp32 carries
//   p' = 24 >= 2p + 2 significand bits (p = 11 for fp16, 8 for bf16), so this
//   double rounding of a sum or product equals the correctly rounded result.
// `dst` and `src` must not partially overlap (the loops use __restrict).
#include "reduce_kernels.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "wire_codec.h"

namespace gradflow {

namespace {

// Element-wise loop over one op. Kept as a plain indexed loop with restrict
// pointers so the compiler vectorizes the arithmetic cases (fp32 sum above all).
template <typename T, typename F>
inline void combine(T* __restrict d, const T* __restrict s, size_t n, F f) {
  for (size_t i = 0; i < n; ++i) d[i] = f(d[i], s[i]);
}

template <typename T>
inline T fmin_nan(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  return (b < a || (b == a && std::signbit(b))) ? b : a;
}

template <typename T>
inline T fmax_nan(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  return (b > a || (b == a && !std::signbit(b))) ? b : a;
}

// Floating types: sum (average), min, max, product.
template <typename T>
void reduce_floating(T* d, const T* s, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage: combine(d, s, n, [](T a, T b) { return a + b; }); return;
    case ReduceOp::kProduct: combine(d, s, n, [](T a, T b) { return a * b; }); return;
    case ReduceOp::kMin: combine(d, s, n, fmin_nan<T>); return;
    case ReduceOp::kMax: combine(d, s, n, fmax_nan<T>); return;
    case ReduceOp::kAdasum: return;  // refused by reduce_supported
  }
}

// Integer types: sum and product in the unsigned type U (wrap-around), min
// and max in the declared type T.
template <typename T, typename U>
void reduce_integer(T* d, const T* s, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAverage:  // the caller scales by 1/size once, as Horovod
      combine(d, s, n, [](T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); });
      return;
    case ReduceOp::kProduct:
      combine(d, s, n, [](T a, T b) { return static_cast<T>(static_cast<U>(a) * static_cast<U>(b)); });
      return;
    case ReduceOp::kMin: combine(d, s, n, [](T a, T b) { return b < a ? b : a; }); return;
    case ReduceOp::kMax: combine(d, s, n, [](T a, T b) { return b > a ? b : a; }); return;
    case ReduceOp::kAdasum: return;  // refused by reduce_supported
  }
}

// Bool is one byte, any non-zero byte is true; results are normalised to 0/1.
void reduce_bool(uint8_t* d, const uint8_t* s, size_t n, ReduceOp op) {
  if (op == ReduceOp::kMin) {
    combine(d, s, n, [](uint8_t a, uint8_t b) { return static_cast<uint8_t>(a != 0 && b != 0); });
  } else {
    combine(d, s, n, [](uint8_t a, uint8_t b) { return static_cast<uint8_t>(a != 0 || b != 0); });
  }
}

// 16-bit floats go through fp32 in stack blocks so the bulk codec (SIMD when
// available) does the conversions; the codec paths are bitwise identical, so
// the result does not depend on the CPU.
constexpr size_t kBlock = 512;

void reduce_16bit(uint16_t* d, const uint16_t* s, size_t n, WireDtype w, ReduceOp op) {
  float a[kBlock];
  float b[kBlock];
  for (size_t off = 0; off < n; off += kBlock) {
    const size_t m = n - off < kBlock ? n - off : kBlock;
    decode_f32(w, d + off, a, m);
    decode_f32(w, s + off, b, m);
    reduce_floating(a, b, m, op);
    encode_f32(w, a, d + off, m);
  }
}

void scale_16bit(uint16_t* buf, size_t n, WireDtype w, float factor) {
  float a[kBlock];
  for (size_t off = 0; off < n; off += kBlock) {
    const size_t m = n - off < kBlock ? n - off : kBlock;
    decode_f32(w, buf + off, a, m);
    for (size_t i = 0; i < m; ++i) a[i] *= factor;
    encode_f32(w, a, buf + off, m);
  }
}

// Integer scaling as Horovod's ScaleBufferCPUImpl does it (Average is a
// postscale of 1/size there too): the product factor * x in double, then the
// conversion back to T, which truncates toward zero. Where the product leaves
// T's range that conversion is undefined in C++; here it saturates (NaN gives
// 0), so every rank writes the same bytes whatever the compiler.
template <typename T>
void scale_integer(T* p, size_t n, double factor) {
  const double lo = static_cast<double>(std::numeric_limits<T>::min());
  // For int64 this rounds up to 2^63, the first value out of range.
  const double hi = static_cast<double>(std::numeric_limits<T>::max());
  for (size_t i = 0; i < n; ++i) {
    const double v = factor * static_cast<double>(p[i]);
    if (v != v) p[i] = 0;
    else if (v <= lo) p[i] = std::numeric_limits<T>::min();
    else if (v >= hi) p[i] = std::numeric_limits<T>::max();
    else p[i] = static_cast<T>(v);
  }
}

bool known_dtype(DataType dt) {
  return static_cast<int32_t>(dt) >= 0 && static_cast<int32_t>(dt) <= static_cast<int32_t>(DataType::kUInt16);
}

bool known_op(ReduceOp op) {
  return static_cast<int32_t>(op) >= 0 &&
         static_cast<int32_t>(op) <= static_cast<int32_t>(ReduceOp::kAdasum);
}

}  // namespace

bool reduce_supported(DataType dt, ReduceOp op, std::string* why) {
  std::string reason;
  if (!known_dtype(dt)) {
    reason = "unknown dtype code " + std::to_string(static_cast<int32_t>(dt));
  } else if (!known_op(op)) {
    reason = "unknown reduce op code " + std::to_string(static_cast<int32_t>(op));
  } else if (op == ReduceOp::kAdasum) {
    // Not element-wise; allreduce runs it through adasum_allreduce.h.
    reason = "Adasum is not an element-wise reduction: only allreduce supports op=Adasum";
  } else if (dt == DataType::kBool && op != ReduceOp::kMin && op != ReduceOp::kMax) {
    reason = std::string(reduce_op_name(op)) +
             " of bool tensors is not supported; use Min (logical and) or Max (logical or)";
  }
  if (reason.empty()) return true;
  if (why) *why = reason;
  return false;
}

void reduce_into(void* dst, const void* src, size_t count, DataType dt, ReduceOp op) {
  std::string why;
  GF_CHECK(reduce_supported(dt, op, &why), "reduce_into: " << why);
  switch (dt) {
    case DataType::kUInt8:
      reduce_integer<uint8_t, uint8_t>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src),
                                       count, op);
      return;
    case DataType::kInt32:
      reduce_integer<int32_t, uint32_t>(static_cast<int32_t*>(dst),
                                        static_cast<const int32_t*>(src), count, op);
      return;
    case DataType::kInt64:
      reduce_integer<int64_t, uint64_t>(static_cast<int64_t*>(dst),
                                        static_cast<const int64_t*>(src), count, op);
      return;
    case DataType::kFloat16:
      reduce_16bit(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count,
                   WireDtype::kFloat16, op);
      return;
    case DataType::kBFloat16:
      reduce_16bit(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), count,
                   WireDtype::kBFloat16, op);
      return;
    case DataType::kFloat32:
      reduce_floating(static_cast<float*>(dst), static_cast<const float*>(src), count, op);
      return;
    case DataType::kFloat64:
      reduce_floating(static_cast<double*>(dst), static_cast<const double*>(src), count, op);
      return;
    case DataType::kInt8:
      reduce_integer<int8_t, uint8_t>(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src),
                                      count, op);
      return;
    case DataType::kInt16:
      reduce_integer<int16_t, uint16_t>(static_cast<int16_t*>(dst),
                                        static_cast<const int16_t*>(src), count, op);
      return;
    case DataType::kUInt16:
      // U = uint32: uint16 * uint16 promotes to (signed) int and can overflow it.
      reduce_integer<uint16_t, uint32_t>(static_cast<uint16_t*>(dst),
                                         static_cast<const uint16_t*>(src), count, op);
      return;
    case DataType::kBool:
      reduce_bool(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), count, op);
      return;
  }
}

namespace {
template <typename T>
void sum_from(T* __restrict d, const T* __restrict a, const T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) d[i] = a[i] + b[i];
}
}  // namespace

void reduce_into_from(void* dst, const void* a, const void* b, size_t count, DataType dt,
                      ReduceOp op) {
  const bool sum = op == ReduceOp::kSum || op == ReduceOp::kAverage;
  if (sum && dt == DataType::kFloat32) {
    sum_from(static_cast<float*>(dst), static_cast<const float*>(a), static_cast<const float*>(b),
             count);
  } else if (sum && dt == DataType::kFloat64) {
    sum_from(static_cast<double*>(dst), static_cast<const double*>(a),
             static_cast<const double*>(b), count);
  } else {
    std::memcpy(dst, a, count * dtype_size(dt));
    reduce_into(dst, b, count, dt, op);
  }
}

namespace {

template <typename T>
void fill_as(void* buf, size_t count, T value) {
  T* p = static_cast<T*>(buf);
  for (size_t i = 0; i < count; ++i) p[i] = value;
}

template <typename T>
void fill_extreme(void* buf, size_t count, bool high) {
  if constexpr (std::numeric_limits<T>::has_infinity) {
    fill_as<T>(buf, count, high ? std::numeric_limits<T>::infinity()
                                : -std::numeric_limits<T>::infinity());
  } else {
    fill_as<T>(buf, count, high ? std::numeric_limits<T>::max() : std::numeric_limits<T>::lowest());
  }
}

}  // namespace

void fill_identity(void* buf, size_t count, DataType dt, ReduceOp op) {
  if (op != ReduceOp::kMin && op != ReduceOp::kMax && op != ReduceOp::kProduct) {
    std::memset(buf, 0, count * dtype_size(dt));
    return;
  }
  const bool high = op == ReduceOp::kMin;  // min's identity is the top of the range
  const bool one = op == ReduceOp::kProduct;
  switch (dt) {
    case DataType::kUInt8: one ? fill_as<uint8_t>(buf, count, 1) : fill_extreme<uint8_t>(buf, count, high); break;
    case DataType::kInt8: one ? fill_as<int8_t>(buf, count, 1) : fill_extreme<int8_t>(buf, count, high); break;
    case DataType::kInt16: one ? fill_as<int16_t>(buf, count, 1) : fill_extreme<int16_t>(buf, count, high); break;
    case DataType::kUInt16: one ? fill_as<uint16_t>(buf, count, 1) : fill_extreme<uint16_t>(buf, count, high); break;
    case DataType::kInt32: one ? fill_as<int32_t>(buf, count, 1) : fill_extreme<int32_t>(buf, count, high); break;
    case DataType::kInt64: one ? fill_as<int64_t>(buf, count, 1) : fill_extreme<int64_t>(buf, count, high); break;
    case DataType::kFloat32: one ? fill_as<float>(buf, count, 1.0f) : fill_extreme<float>(buf, count, high); break;
    case DataType::kFloat64: one ? fill_as<double>(buf, count, 1.0) : fill_extreme<double>(buf, count, high); break;
    // 16-bit floats by bit pattern: 1.0, +inf, -inf.
    case DataType::kFloat16: fill_as<uint16_t>(buf, count, one ? 0x3C00 : high ? 0x7C00 : 0xFC00); break;
    case DataType::kBFloat16: fill_as<uint16_t>(buf, count, one ? 0x3F80 : high ? 0x7F80 : 0xFF80); break;
    case DataType::kBool: fill_as<uint8_t>(buf, count, high || one ? 1 : 0); break;
  }
}

void scale_buffer(void* buf, size_t count, DataType dt, double factor) {
  // factor == 1 is what Sum passes: a no-op for every dtype, bool included.
  if (factor == 1.0) return;
  GF_CHECK(known_dtype(dt), "scale_buffer: unknown dtype code " << static_cast<int32_t>(dt));
  GF_CHECK(dt != DataType::kBool, "scale_buffer: cannot scale bool tensors by " << factor);
  switch (dt) {
    case DataType::kFloat16:
      scale_16bit(static_cast<uint16_t*>(buf), count, WireDtype::kFloat16, static_cast<float>(factor));
      return;
    case DataType::kBFloat16:
      scale_16bit(static_cast<uint16_t*>(buf), count, WireDtype::kBFloat16, static_cast<float>(factor));
      return;
    case DataType::kFloat32: {
      float* p = static_cast<float*>(buf);
      const float f = static_cast<float>(factor);
      for (size_t i = 0; i < count; ++i) p[i] *= f;
      return;
    }
    case DataType::kFloat64: {
      double* p = static_cast<double*>(buf);
      for (size_t i = 0; i < count; ++i) p[i] *= factor;
      return;
    }
    case DataType::kUInt8: scale_integer(static_cast<uint8_t*>(buf), count, factor); return;
    case DataType::kInt8: scale_integer(static_cast<int8_t*>(buf), count, factor); return;
    case DataType::kInt16: scale_integer(static_cast<int16_t*>(buf), count, factor); return;
    case DataType::kUInt16: scale_integer(static_cast<uint16_t*>(buf), count, factor); return;
    case DataType::kInt32: scale_integer(static_cast<int32_t*>(buf), count, factor); return;
    case DataType::kInt64: scale_integer(static_cast<int64_t*>(buf), count, factor); return;
    default: return;  // bool refused above
  }
}

}  // namespace gradflow
