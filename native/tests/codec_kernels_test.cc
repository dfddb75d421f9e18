// codec_kernels_test.cc — standalone checks of wire_codec and reduce_kernels:
// SIMD vs scalar bitwise, known bit patterns, round trips, reduce_into against
// plain reference loops, and refusal of unsupported (dtype, op) pairs.

// Build: g++ -O2 -std=c++17 -I native native/common.cc native/wire_codec.cc
//        native/reduce_kernels.cc native/tests/codec_kernels_test.cc -o /tmp/codec_test
// Run with --exhaustive to also check all 2^32 float inputs of the encoders.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "reduce_kernels.h"
#include "wire_codec.h"

using namespace gradflow;

namespace {

int g_checks = 0, g_failures = 0;

#define EXPECT(cond, ...)                                             \
  do {                                                                \
    ++g_checks;                                                       \
    if (!(cond)) {                                                    \
      if (++g_failures <= 40) {                                       \
        std::printf("FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);   \
        std::printf(__VA_ARGS__);                                     \
        std::printf("\n");                                            \
      }                                                               \
    }                                                                 \
  } while (0)

uint32_t fbits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
float bitsf(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
bool same_or_both_nan(float a, float b) {
  return fbits(a) == fbits(b) || (std::isnan(a) && std::isnan(b));
}
bool is_half_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF); }
bool is_bf16_nan(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F); }
const WireDtype kWires[] = {WireDtype::kFloat16, WireDtype::kBFloat16};

// Runs fn once with the scalar path and once with SIMD (if the CPU has it).
void both_paths(const std::function<void(bool simd)>& fn) {
  const bool prev = set_codec_simd_enabled(false);
  fn(false);
  if (codec_simd_available()) {
    set_codec_simd_enabled(true);
    fn(true);
  }
  set_codec_simd_enabled(prev);
}

void test_known_patterns() {
  struct { float f; uint16_t h; } half_cases[] = {
      {0.0f, 0x0000}, {-0.0f, 0x8000}, {1.0f, 0x3C00}, {-2.0f, 0xC000}, {0.1f, 0x2E66},
      {1.0f / 3, 0x3555}, {65504.0f, 0x7BFF}, {65519.99f, 0x7BFF}, {65520.0f, 0x7C00},
      {-65520.0f, 0xFC00}, {1e9f, 0x7C00}, {INFINITY, 0x7C00}, {-INFINITY, 0xFC00},
      {std::ldexp(1.0f, -14), 0x0400}, {std::ldexp(1.0f, -24), 0x0001},
      {std::ldexp(1.0f, -25), 0x0000}, {std::nextafter(std::ldexp(1.0f, -25), 1.0f), 0x0001},
      {std::ldexp(3.0f, -25), 0x0002}, {std::ldexp(5.0f, -25), 0x0002},  // ties to even
      {std::ldexp(1023.0f, -24), 0x03FF}, {std::ldexp(2047.0f, -25), 0x0400},
      {1.0f + std::ldexp(1.0f, -11), 0x3C00}, {1.0f + std::ldexp(3.0f, -11), 0x3C02},
      {std::numeric_limits<float>::denorm_min(), 0x0000}, {-1e-30f, 0x8000},
      {bitsf(0x7FC00000), 0x7E00}, {bitsf(0xFFC00000), 0xFE00}, {bitsf(0x7F800001), 0x7E00},
      {bitsf(0x7FFFFFFF), 0x7FFF},
  };
  for (auto& c : half_cases) {
    EXPECT(float_to_half(c.f) == c.h, "float_to_half(%a)=0x%04x want 0x%04x", c.f,
           float_to_half(c.f), c.h);
  }
  struct { uint16_t h; float f; } decode_cases[] = {
      {0x0001, std::ldexp(1.0f, -24)}, {0x03FF, std::ldexp(1023.0f, -24)},
      {0x0400, std::ldexp(1.0f, -14)}, {0x7BFF, 65504.0f}, {0xFC00, -INFINITY},
      {0x8000, -0.0f}, {0x3555, 0.333251953125f},
  };
  for (auto& c : decode_cases) {
    EXPECT(fbits(half_to_float(c.h)) == fbits(c.f), "half_to_float(0x%04x)=%a want %a", c.h,
           half_to_float(c.h), c.f);
  }
  EXPECT(std::isnan(half_to_float(0x7C01)), "0x7C01 must decode to NaN");
  struct { uint32_t x; uint16_t h; } bf_cases[] = {
      {0x3F800000, 0x3F80}, {0x3F808000, 0x3F80}, {0x3F818000, 0x3F82}, {0x3F808001, 0x3F81},
      {0x7F7FFFFF, 0x7F80}, {0x7F7F7FFF, 0x7F7F}, {0x7F800000, 0x7F80}, {0xFF800000, 0xFF80},
      {0x7F800001, 0x7FC0}, {0xFFFFFFFF, 0xFFFF}, {0x80000000, 0x8000}, {0x00000001, 0x0000},
      {0x00008000, 0x0000}, {0x00018000, 0x0002},
  };
  for (auto& c : bf_cases) {
    EXPECT(float_to_bf16(bitsf(c.x)) == c.h, "float_to_bf16(0x%08x)=0x%04x want 0x%04x", c.x,
           float_to_bf16(bitsf(c.x)), c.h);
  }
  EXPECT(fbits(bf16_to_float(0x3F80)) == 0x3F800000u, "bf16 1.0");
}

// All 65536 patterns: decode paths agree, and encode(decode(h)) == h (NaNs quieted).
void test_exhaustive_decode() {
  std::vector<uint16_t> all(65536), back(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (WireDtype w : kWires) {
    const bool fp16 = w == WireDtype::kFloat16;
    std::vector<float> ref(65536), got(65536), acc_ref(65536), acc_got(65536);
    set_codec_simd_enabled(false);
    decode_f32(w, all.data(), ref.data(), 65536);
    both_paths([&](bool simd) {
      // Odd offsets and lengths exercise the scalar tails of the SIMD kernels.
      for (size_t off : {0, 1, 3}) {
        std::fill(got.begin(), got.end(), 0.0f);
        decode_f32(w, all.data() + off, got.data() + off, 65536 - off);
        size_t bad = 0;
        for (size_t i = off; i < 65536; ++i) bad += fbits(got[i]) != fbits(ref[i]);
        EXPECT(bad == 0, "%s decode simd=%d off=%zu: %zu mismatches", wire_dtype_name(w), simd,
               off, bad);
      }
      for (uint32_t i = 0; i < 65536; ++i) {
        float want = fp16 ? half_to_float(all[i]) : bf16_to_float(all[i]);
        EXPECT(fbits(ref[i]) == fbits(want), "bulk vs scalar decode 0x%04x", i);
      }
      encode_f32(w, ref.data(), back.data(), 65536);
      for (uint32_t i = 0; i < 65536; ++i) {
        const uint16_t h = all[i];
        const bool nan = fp16 ? is_half_nan(h) : is_bf16_nan(h);
        const uint16_t want = nan ? static_cast<uint16_t>(h | (fp16 ? 0x200 : 0x40)) : h;
        EXPECT(back[i] == want, "%s round trip simd=%d 0x%04x -> 0x%04x", wire_dtype_name(w), simd,
               h, back[i]);
      }
    });
    // decode_accumulate: dst += decode(src), on a mixed dst (including inf/NaN).
    std::mt19937 rng(7);
    std::vector<float> base(65536);
    for (auto& v : base) v = half_to_float(static_cast<uint16_t>(rng())) * 3.0f;
    base[5] = INFINITY; base[6] = -INFINITY; base[7] = NAN;
    for (uint32_t i = 0; i < 65536; ++i) {
      acc_ref[i] = base[i] + (fp16 ? half_to_float(all[i]) : bf16_to_float(all[i]));
    }
    both_paths([&](bool simd) {
      acc_got = base;
      decode_accumulate_f32(w, all.data() + 1, acc_got.data() + 1, 65535);
      size_t bad = 0;
      // Bitwise, except NaN + NaN, whose payload depends on operand order (the
      // compiler may commute a float add) — there only NaN-ness is required.
      for (size_t i = 1; i < 65536; ++i) bad += !same_or_both_nan(acc_got[i], acc_ref[i]);
      EXPECT(bad == 0, "%s decode_accumulate simd=%d: %zu mismatches", wire_dtype_name(w), simd,
             bad);
    });
  }
}

std::vector<float> encode_inputs() {
  std::vector<float> v;
  const uint32_t centres[] = {0x477FE000u /*65504*/, 0x477FF000u /*65520*/, 0x38800000u /*2^-14*/,
                              0x33800000u /*2^-24*/, 0x33000000u /*2^-25*/, 0x7F800000u,
                              0x7F7FFFFFu, 0x3F800000u, 0x00000000u, 0x00800000u};
  for (uint32_t c : centres) {
    for (int64_t d = -5000; d <= 5000; ++d) {
      const uint32_t x = static_cast<uint32_t>(static_cast<int64_t>(c) + d);
      v.push_back(bitsf(x));
      v.push_back(bitsf(x | 0x80000000u));
    }
  }
  std::mt19937 rng(12345);
  for (int i = 0; i < 2000000; ++i) v.push_back(bitsf(rng()));  // every class, incl. NaN payloads
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int i = 0; i < 1000000; ++i) v.push_back(g(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 50) - 30));
  // fp16 tie points: exactly half-way between neighbouring halves.
  for (uint32_t h = 0; h < 0x7BFF; h += 7) {
    const float mid = 0.5f * (half_to_float(static_cast<uint16_t>(h)) + half_to_float(static_cast<uint16_t>(h + 1)));
    v.push_back(mid);
    v.push_back(-mid);
  }
  return v;
}

void check_encode_paths(const std::vector<float>& in, const char* what) {
  for (WireDtype w : kWires) {
    std::vector<uint16_t> ref(in.size()), got(in.size());
    set_codec_simd_enabled(false);
    const bool ref_over = encode_f32(w, in.data(), ref.data(), in.size());
    size_t bad_scalar = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      bad_scalar += ref[i] != (w == WireDtype::kFloat16 ? float_to_half(in[i]) : float_to_bf16(in[i]));
    }
    EXPECT(bad_scalar == 0, "%s %s: bulk scalar differs from reference in %zu", what,
           wire_dtype_name(w), bad_scalar);
    both_paths([&](bool simd) {
      for (size_t off : {0, 1, 5}) {
        const bool over = encode_f32(w, in.data() + off, got.data() + off, in.size() - off);
        size_t bad = 0, first = 0;
        for (size_t i = off; i < in.size(); ++i) {
          if (got[i] != ref[i] && bad++ == 0) first = i;
        }
        EXPECT(bad == 0, "%s %s encode simd=%d off=%zu: %zu mismatches, first %a -> 0x%04x want 0x%04x",
               what, wire_dtype_name(w), simd, off, bad, in[first], got[first], ref[first]);
        if (off == 0) EXPECT(over == ref_over, "%s overflow flag simd=%d", what, simd);
      }
      // The flag per small block (so it is not trivially true), against the elements.
      size_t bad_flags = 0;
      const uint16_t inf = w == WireDtype::kFloat16 ? 0x7C00 : 0x7F80;
      for (size_t b = 0; b + 37 <= in.size(); b += 37) {
        bool want = false;
        for (size_t i = b; i < b + 37; ++i) want |= !std::isinf(in[i]) && !std::isnan(in[i]) && (ref[i] & 0x7FFF) == inf;
        bad_flags += encode_f32(w, in.data() + b, got.data() + b, 37) != want;
      }
      EXPECT(bad_flags == 0, "%s %s overflow flag simd=%d wrong in %zu blocks", what, wire_dtype_name(w), simd, bad_flags);
    });
  }
}

void test_overflow_flag() {
  struct Case { WireDtype w; std::vector<float> v; bool want; };
  const float fmax = std::numeric_limits<float>::max();
  const Case cases[] = {
      {WireDtype::kFloat16, {1.0f, 65504.0f, INFINITY, -INFINITY, NAN}, false},
      {WireDtype::kFloat16, {1.0f, 65519.99f}, false},
      {WireDtype::kFloat16, {1.0f, 65520.0f}, true},
      {WireDtype::kFloat16, {-1e6f}, true},
      {WireDtype::kBFloat16, {1e38f, INFINITY, NAN, 65520.0f}, false},
      {WireDtype::kBFloat16, {fmax}, true},
  };
  for (const Case& c : cases) {
    // Lead/trail padding puts the cases in the SIMD body (8-wide) or in the scalar tail.
    const std::pair<size_t, size_t> pads[] = {{0, 16}, {3, 16}, {13, 16}, {8, 0}, {16, 2}};
    for (auto [pad, trail] : pads) {
      std::vector<float> v(pad, 0.5f);
      v.insert(v.end(), c.v.begin(), c.v.end());
      v.insert(v.end(), trail, -0.25f);
      std::vector<uint16_t> out(v.size());
      both_paths([&](bool simd) {
        EXPECT(encode_f32(c.w, v.data(), out.data(), v.size()) == c.want,
               "overflow flag %s pad=%zu simd=%d", wire_dtype_name(c.w), pad, simd);
      });
    }
  }
  bool threw = false;
  try { encode_f32(WireDtype::kNative, nullptr, nullptr, 0); } catch (const GradflowError&) { threw = true; }
  EXPECT(threw, "encode_f32 must refuse WireDtype::kNative");
}

// ---- reduce_into against reference loops ----

template <typename T> T ref_min(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return std::signbit(static_cast<double>(a)) ? a : b;
  return a < b ? a : b;
}
template <typename T> T ref_max(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return std::signbit(static_cast<double>(a)) ? b : a;
  return a > b ? a : b;
}
template <typename T> T ref_op(ReduceOp op, T a, T b) {
  switch (op) {
    case ReduceOp::kSum: case ReduceOp::kAverage: return a + b;
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin: return ref_min(a, b);
    case ReduceOp::kMax: return ref_max(a, b);
  }
  return a;
}

const DataType kDtypes[] = {DataType::kUInt8, DataType::kInt32, DataType::kInt64, DataType::kFloat16,
                            DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64, DataType::kBool};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax,
                         ReduceOp::kProduct};

// Fills `n` elements of dtype dt with random values (some specials for floats).
void fill(std::vector<unsigned char>& buf, DataType dt, size_t n, std::mt19937_64& rng) {
  buf.assign(n * dtype_size(dt), 0);
  std::uniform_real_distribution<double> u(-100.0, 100.0);
  const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 65504.0, 1e-7};
  for (size_t i = 0; i < n; ++i) {
    const double x = (rng() % 16 == 0) ? specials[rng() % 7] : u(rng);
    unsigned char* p = buf.data() + i * dtype_size(dt);
    switch (dt) {
      case DataType::kUInt8: { uint8_t v = static_cast<uint8_t>(rng()); std::memcpy(p, &v, 1); break; }
      case DataType::kBool: { uint8_t v = static_cast<uint8_t>(rng() % 3 ? rng() % 2 : rng()); std::memcpy(p, &v, 1); break; }
      case DataType::kInt32: { int32_t v = static_cast<int32_t>(rng()); std::memcpy(p, &v, 4); break; }
      case DataType::kInt64: { int64_t v = static_cast<int64_t>(rng()); std::memcpy(p, &v, 8); break; }
      case DataType::kFloat16: { uint16_t v = float_to_half(static_cast<float>(x)); std::memcpy(p, &v, 2); break; }
      case DataType::kBFloat16: { uint16_t v = float_to_bf16(static_cast<float>(x)); std::memcpy(p, &v, 2); break; }
      case DataType::kFloat32: { float v = static_cast<float>(x); std::memcpy(p, &v, 4); break; }
      case DataType::kFloat64: std::memcpy(p, &x, 8); break;
    }
  }
}

template <typename T> T ld(const unsigned char* p, size_t i) { T v; std::memcpy(&v, p + i * sizeof(T), sizeof(T)); return v; }

// Reference result element i of dst (op) src, as raw bytes.
void ref_element(DataType dt, ReduceOp op, const unsigned char* d, const unsigned char* s, size_t i, unsigned char* out) {
  switch (dt) {
    case DataType::kUInt8: {
      uint8_t a = ld<uint8_t>(d, i), b = ld<uint8_t>(s, i);
      uint8_t r = op == ReduceOp::kMin ? std::min(a, b) : op == ReduceOp::kMax ? std::max(a, b)
                : (op == ReduceOp::kSum || op == ReduceOp::kAverage) ? static_cast<uint8_t>(a + b) : static_cast<uint8_t>(a * b);
      std::memcpy(out, &r, 1); return;
    }
    case DataType::kBool: {
      bool a = ld<uint8_t>(d, i) != 0, b = ld<uint8_t>(s, i) != 0;
      uint8_t r = op == ReduceOp::kMin ? (a && b) : (a || b);
      std::memcpy(out, &r, 1); return;
    }
    case DataType::kInt32: {
      int64_t a = ld<int32_t>(d, i), b = ld<int32_t>(s, i);
      int64_t r = op == ReduceOp::kMin ? std::min(a, b) : op == ReduceOp::kMax ? std::max(a, b)
                : (op == ReduceOp::kSum || op == ReduceOp::kAverage) ? a + b : static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
      int32_t r32 = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(r)));
      std::memcpy(out, &r32, 4); return;
    }
    case DataType::kInt64: {
      uint64_t a = ld<uint64_t>(d, i), b = ld<uint64_t>(s, i);
      int64_t sa = static_cast<int64_t>(a), sb = static_cast<int64_t>(b);
      uint64_t r = op == ReduceOp::kMin ? static_cast<uint64_t>(std::min(sa, sb))
                 : op == ReduceOp::kMax ? static_cast<uint64_t>(std::max(sa, sb))
                 : (op == ReduceOp::kSum || op == ReduceOp::kAverage) ? a + b : a * b;
      std::memcpy(out, &r, 8); return;
    }
    case DataType::kFloat16: case DataType::kBFloat16: {
      const bool h = dt == DataType::kFloat16;
      float a = h ? half_to_float(ld<uint16_t>(d, i)) : bf16_to_float(ld<uint16_t>(d, i));
      float b = h ? half_to_float(ld<uint16_t>(s, i)) : bf16_to_float(ld<uint16_t>(s, i));
      uint16_t r = h ? float_to_half(ref_op(op, a, b)) : float_to_bf16(ref_op(op, a, b));
      std::memcpy(out, &r, 2); return;
    }
    case DataType::kFloat32: { float r = ref_op(op, ld<float>(d, i), ld<float>(s, i)); std::memcpy(out, &r, 4); return; }
    case DataType::kFloat64: { double r = ref_op(op, ld<double>(d, i), ld<double>(s, i)); std::memcpy(out, &r, 8); return; }
  }
}

bool is_nan_elem(DataType dt, const unsigned char* p) {
  switch (dt) {
    case DataType::kFloat16: { uint16_t h; std::memcpy(&h, p, 2); return is_half_nan(h); }
    case DataType::kBFloat16: { uint16_t h; std::memcpy(&h, p, 2); return is_bf16_nan(h); }
    case DataType::kFloat32: { float f; std::memcpy(&f, p, 4); return std::isnan(f); }
    case DataType::kFloat64: { double f; std::memcpy(&f, p, 8); return std::isnan(f); }
    default: return false;
  }
}

void test_reduce() {
  std::mt19937_64 rng(99);
  for (size_t k = 0; k < 8; ++k) {
    const DataType dt = kDtypes[k];
    for (ReduceOp op : kOps) {
      const bool bool_ok = op == ReduceOp::kMin || op == ReduceOp::kMax;
      // Integer Average reduces as Sum; the caller scales by 1/size once
      // (scale_buffer, as Horovod), so it is supported for every numeric dtype.
      const bool want = dt == DataType::kBool ? bool_ok : true;
      std::string why;
      const bool ok = reduce_supported(dt, op, &why);
      EXPECT(ok == want, "reduce_supported(%s, %s)", dtype_name(dt), reduce_op_name(op));
      if (!ok) {
        EXPECT(why.find("not supported") != std::string::npos && why.find(dtype_name(dt)) != std::string::npos,
               "why for (%s, %s) = '%s'", dtype_name(dt), reduce_op_name(op), why.c_str());
        bool threw = false;
        unsigned char a[8] = {}, b[8] = {};
        try { reduce_into(a, b, 1, dt, op); } catch (const GradflowError& e) {
          threw = std::string(e.what()).find(why) != std::string::npos;
        }
        EXPECT(threw, "reduce_into(%s, %s) must throw with the reason", dtype_name(dt), reduce_op_name(op));
        continue;
      }
      for (size_t n : {0, 1, 7, 8, 9, 17, 511, 512, 513, 1031, 5000}) {
        std::vector<unsigned char> d, s, want_buf, got;
        fill(d, dt, n, rng);
        fill(s, dt, n, rng);
        want_buf = d;
        for (size_t i = 0; i < n; ++i) ref_element(dt, op, d.data(), s.data(), i, want_buf.data() + i * dtype_size(dt));
        both_paths([&](bool simd) {
          got = d;
          reduce_into(got.data(), s.data(), n, dt, op);
          size_t bad = 0;
          const size_t es = dtype_size(dt);
          for (size_t i = 0; i < n; ++i) {
            const unsigned char* g = got.data() + i * es;
            const unsigned char* w = want_buf.data() + i * es;
            // NaN + NaN: payload depends on operand order, accept any NaN.
            if (std::memcmp(g, w, es) != 0 && !(is_nan_elem(dt, g) && is_nan_elem(dt, w))) ++bad;
          }
          EXPECT(bad == 0, "reduce_into(%s, %s) n=%zu simd=%d: %zu mismatches", dtype_name(dt),
                 reduce_op_name(op), n, simd, bad);
        });
      }
    }
  }
  // Commutativity of float min/max at signed zeros and NaN-ness.
  float a = -0.0f, b = 0.0f, c = 0.0f, d = -0.0f;
  reduce_into(&a, &b, 1, DataType::kFloat32, ReduceOp::kMin);
  reduce_into(&c, &d, 1, DataType::kFloat32, ReduceOp::kMin);
  EXPECT(fbits(a) == 0x80000000u && fbits(c) == 0x80000000u, "min(+-0) must be -0 either way");
  float e = 1.0f, f = NAN;
  reduce_into(&e, &f, 1, DataType::kFloat32, ReduceOp::kMax);
  EXPECT(std::isnan(e), "max(1, NaN) must be NaN");
  bool threw = false;
  try { reduce_into(&e, &f, 1, static_cast<DataType>(42), ReduceOp::kSum); } catch (const GradflowError&) { threw = true; }
  EXPECT(threw, "unknown dtype code must throw");
#ifdef __FLT16_MAX__
  // fp32 sum then one rounding == correctly rounded fp16 sum (double rounding is innocuous).
  std::mt19937 r32(5);
  size_t bad = 0;
  for (int i = 0; i < 1000000; ++i) {
    uint16_t x = static_cast<uint16_t>(r32()), y = static_cast<uint16_t>(r32());
    if (is_half_nan(x) || is_half_nan(y) || (x & 0x7C00) == 0x7C00 || (y & 0x7C00) == 0x7C00) continue;
    const double exact = static_cast<double>(half_to_float(x)) + half_to_float(y);  // exact in double
    const _Float16 correct = static_cast<_Float16>(exact);
    uint16_t cb; std::memcpy(&cb, &correct, 2);
    uint16_t got = x;
    reduce_into(&got, &y, 1, DataType::kFloat16, ReduceOp::kSum);
    bad += got != cb && !(cb == 0 && got == 0x8000) && !(cb == 0x8000 && got == 0);
  }
  EXPECT(bad == 0, "fp16 sum not correctly rounded in %zu cases", bad);
#endif
}

void test_scale() {
  std::mt19937_64 rng(3);
  const double factors[] = {0.25, 1.0 / 3.0, -2.0, 1e-3, 1e5};
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64}) {
    for (double fct : factors) {
      const size_t n = 1031;
      std::vector<unsigned char> buf;
      fill(buf, dt, n, rng);
      std::vector<unsigned char> want = buf;
      for (size_t i = 0; i < n; ++i) {
        unsigned char* p = want.data() + i * dtype_size(dt);
        if (dt == DataType::kFloat64) { double v = ld<double>(p, 0) * fct; std::memcpy(p, &v, 8); }
        else if (dt == DataType::kFloat32) { float v = ld<float>(p, 0) * static_cast<float>(fct); std::memcpy(p, &v, 4); }
        else {
          const bool h = dt == DataType::kFloat16;
          uint16_t x = ld<uint16_t>(p, 0);
          float v = (h ? half_to_float(x) : bf16_to_float(x)) * static_cast<float>(fct);
          x = h ? float_to_half(v) : float_to_bf16(v);
          std::memcpy(p, &x, 2);
        }
      }
      both_paths([&](bool simd) {
        std::vector<unsigned char> got = buf;
        scale_buffer(got.data(), n, dt, fct);
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          const unsigned char* g = got.data() + i * dtype_size(dt);
          const unsigned char* w = want.data() + i * dtype_size(dt);
          bad += std::memcmp(g, w, dtype_size(dt)) != 0 && !(is_nan_elem(dt, g) && is_nan_elem(dt, w));
        }
        EXPECT(bad == 0, "scale_buffer(%s, %g) simd=%d: %zu mismatches", dtype_name(dt), fct, simd, bad);
      });
    }
  }
  {  // bool cannot be scaled; factor 1 is a no-op for every dtype
    uint8_t x[4] = {1, 0, 1, 1};
    bool threw = false;
    try { scale_buffer(x, 4, DataType::kBool, 0.5); } catch (const GradflowError&) { threw = true; }
    EXPECT(threw, "scale_buffer(bool, 0.5) must throw");
    scale_buffer(x, 4, DataType::kBool, 1.0);
    EXPECT(x[0] == 1 && x[1] == 0, "scale_buffer(bool, 1) must not touch data");
  }
  {  // integers as Horovod: the product in double, truncated toward zero; saturating
    int32_t a[5] = {5, -5, 7, std::numeric_limits<int32_t>::max(), -1};
    scale_buffer(a, 5, DataType::kInt32, 0.5);
    EXPECT(a[0] == 2 && a[1] == -2 && a[2] == 3 && a[3] == 1073741823 && a[4] == 0,
           "scale_buffer(int32, 0.5) truncates toward zero");
    int32_t b[2] = {std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min()};
    scale_buffer(b, 2, DataType::kInt32, 3.0);
    EXPECT(b[0] == std::numeric_limits<int32_t>::max() && b[1] == std::numeric_limits<int32_t>::min(),
           "scale_buffer(int32, 3) saturates");
    uint8_t c[3] = {255, 3, 10};
    scale_buffer(c, 3, DataType::kUInt8, 2.0);
    EXPECT(c[0] == 255 && c[1] == 6 && c[2] == 20, "scale_buffer(uint8, 2) saturates at 255");
    int64_t d[2] = {9, -9};
    scale_buffer(d, 2, DataType::kInt64, 1.0 / 3.0);
    EXPECT(d[0] == 3 && d[1] == -3, "scale_buffer(int64, 1/3)");
    scale_buffer(d, 2, DataType::kInt64, 1.0);
    EXPECT(d[0] == 3 && d[1] == -3, "scale_buffer(int64, 1) must not touch data");
  }
}

// Every float bit pattern through both encoders (and the compiler's _Float16).
void test_encode_all_floats() {
  const size_t kChunk = 1u << 24;
  std::vector<float> in(kChunk);
  for (uint64_t base = 0; base < (1ull << 32); base += kChunk) {
    for (size_t i = 0; i < kChunk; ++i) in[i] = bitsf(static_cast<uint32_t>(base + i));
    check_encode_paths(in, "all-floats");
#ifdef __FLT16_MAX__
    size_t bad = 0;
    for (size_t i = 0; i < kChunk; ++i) {
      if (std::isnan(in[i])) continue;
      const _Float16 c = static_cast<_Float16>(in[i]);
      uint16_t cb; std::memcpy(&cb, &c, 2);
      bad += cb != float_to_half(in[i]);
    }
    EXPECT(bad == 0, "float_to_half vs _Float16 at base 0x%08llx: %zu", static_cast<unsigned long long>(base), bad);
#endif
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bool exhaustive = argc > 1 && std::string(argv[1]) == "--exhaustive";
  std::printf("codec: simd available=%d, impl=%s\n", codec_simd_available(), codec_impl_name());
  test_known_patterns();
  test_exhaustive_decode();
  check_encode_paths(encode_inputs(), "random+edges");
  test_overflow_flag();
  test_reduce();
  test_scale();
  if (exhaustive) test_encode_all_floats();
  std::printf("%s: %d checks, %d failures%s\n", g_failures ? "FAILED" : "OK", g_checks, g_failures,
              codec_simd_available() ? "" : " (SIMD path not available on this CPU: scalar only)");
  return g_failures ? 1 : 0;
}
