// wire_codec.cc — float32 <-> fp16/bf16: the scalar reference conversions and
// the bulk kernels, with an AVX2+F16C path picked at run time. Owns only the
// "SIMD on/off" switch; no MPI, no configuration. The scalar code is the
// specification: the SIMD path must match it bit for bit (NaNs included).
#include "wire_codec.h"

#include <atomic>
#include <cstring>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define GF_CODEC_X86 1
#include <immintrin.h>
#else
#define GF_CODEC_X86 0
#endif

namespace gradflow {

namespace {

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Magnitudes at or above this round to inf in fp16: 65520 is the midpoint
// between 65504 (largest fp16, odd mantissa) and 65536, so ties go up.
constexpr uint32_t kHalfOverflowBits = 0x477FF000u;  // 65520.0f
constexpr uint32_t kFloatInfBits = 0x7F800000u;

}  // namespace

// ---- scalar reference conversions ----
//
// NaN conventions follow what F16C does, so that both paths agree bitwise:
// float->half keeps the sign and the top 9 payload bits and sets the quiet
// bit; half->float widens the payload and sets the quiet bit. bf16 is
// treated the same way (quiet bit set on encode, exact widening on decode).

uint16_t float_to_half(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > kFloatInfBits) {  // NaN
    return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x01FFu));
  }
  if (ax >= kHalfOverflowBits) return static_cast<uint16_t>(sign | 0x7C00u);  // inf, overflow
  if (ax >= 0x38800000u) {  // >= 2^-14: a normal fp16
    // Rebias the exponent (127 -> 15) and add 0xFFF + lsb so that the
    // truncating shift rounds to nearest even; a carry bumps the exponent.
    const uint32_t lsb = (ax >> 13) & 1u;
    const uint32_t r = ax - (112u << 23) + 0x0FFFu + lsb;
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // fp16 subnormal (or zero): value = q * 2^-24 with q = m >> shift.
  const uint32_t e = ax >> 23;
  if (e < 102) return sign;  // < 2^-25: rounds to zero (2^-25 itself ties to 0)
  const uint32_t m = (ax & 0x007FFFFFu) | 0x00800000u;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // may carry into 0x400 = min normal
  return static_cast<uint16_t>(sign | q);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1Fu;
  uint32_t m = h & 0x03FFu;
  if (e == 0x1F) {  // inf or NaN (NaN made quiet, as vcvtph2ps does)
    return bits_float(sign | kFloatInfBits | (m << 13) | (m ? 0x00400000u : 0u));
  }
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    // Subnormal m * 2^-24: normalise so the implicit bit lands at bit 10.
    uint32_t fe = 113;
    while (!(m & 0x0400u)) {
      m <<= 1;
      --fe;
    }
    return bits_float(sign | (fe << 23) | ((m & 0x03FFu) << 13));
  }
  return bits_float(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t float_to_bf16(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7FFFFFFFu) > kFloatInfBits) {  // NaN: truncate, force quiet so it stays NaN
    return static_cast<uint16_t>((x | 0x00400000u) >> 16);
  }
  // Round to nearest even on the low 16 bits; FLT_MAX-ish values carry into inf.
  const uint32_t lsb = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7FFFu + lsb) >> 16);
}

float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

// ---- dispatch ----

namespace {

bool detect_simd() {
#if GF_CODEC_X86
  __builtin_cpu_init();  // needed if we run before libgcc's own constructor
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

std::atomic<bool>& simd_switch() {
  static std::atomic<bool> enabled{codec_simd_available()};
  return enabled;
}

inline bool use_simd() { return simd_switch().load(std::memory_order_relaxed); }

void check_wire(WireDtype wire, const char* fn) {
  GF_CHECK(wire == WireDtype::kFloat16 || wire == WireDtype::kBFloat16,
           fn << ": wire dtype must be fp16 or bf16, got " << wire_dtype_name(wire));
}

// "finite input, non-finite output": the overflow flag of encode_f32.
inline bool overflowed(float in, uint16_t out, uint16_t inf_bits) {
  return (float_bits(in) & 0x7FFFFFFFu) < kFloatInfBits && (out & 0x7FFFu) == inf_bits;
}

// ---- scalar bulk kernels (also the tails of the SIMD kernels) ----

bool encode_scalar(WireDtype wire, const float* src, uint16_t* dst, size_t n) {
  bool over = false;
  if (wire == WireDtype::kFloat16) {
    for (size_t i = 0; i < n; ++i) {
      dst[i] = float_to_half(src[i]);
      over |= overflowed(src[i], dst[i], 0x7C00u);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      dst[i] = float_to_bf16(src[i]);
      over |= overflowed(src[i], dst[i], 0x7F80u);
    }
  }
  return over;
}

void decode_scalar(WireDtype wire, const uint16_t* src, float* dst, size_t n) {
  if (wire == WireDtype::kFloat16) {
    for (size_t i = 0; i < n; ++i) dst[i] = half_to_float(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
  }
}

void decode_accumulate_scalar(WireDtype wire, const uint16_t* src, float* dst, size_t n) {
  if (wire == WireDtype::kFloat16) {
    for (size_t i = 0; i < n; ++i) dst[i] += half_to_float(src[i]);
  } else {
    for (size_t i = 0; i < n; ++i) dst[i] += bf16_to_float(src[i]);
  }
}

#if GF_CODEC_X86
// ---- AVX2 + F16C kernels, 8 floats per step; tails go to the scalar code ----
// Compiled with target attributes so the file builds without -mavx2/-mf16c;
// they are only called after detect_simd() said yes.

#define GF_SIMD __attribute__((target("avx2,f16c")))

GF_SIMD inline __m128i bf16_round8(__m256i x) {
  // x + 0x7FFF + lsb, except NaNs which get the quiet bit; then take the top half.
  const __m256i abs = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(static_cast<int>(kFloatInfBits)));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_add_epi32(x, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb));
  const __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x00400000));
  const __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, is_nan), 16);
  // r is 0..0xFFFF per lane, so the unsigned-saturating pack is exact; packus
  // works per 128-bit lane, so gather lanes 0 and 2 (the packed halves).
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
  return _mm256_castsi256_si128(packed);
}

GF_SIMD bool encode_simd(WireDtype wire, const float* src, uint16_t* dst, size_t n) {
  const bool fp16 = wire == WireDtype::kFloat16;
  // fp16 overflow <=> finite input with magnitude >= 65520 (rounds to inf).
  const __m256i over_lo = _mm256_set1_epi32(static_cast<int>(kHalfOverflowBits - 1));
  const __m256i inf = _mm256_set1_epi32(static_cast<int>(kFloatInfBits));
  const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i over = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    const __m256i x = _mm256_castps_si256(v);
    const __m128i h = fp16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                           : bf16_round8(x);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
    const __m256i a = _mm256_and_si256(x, abs_mask);
    if (fp16) {
      over = _mm256_or_si256(over, _mm256_and_si256(_mm256_cmpgt_epi32(a, over_lo),
                                                    _mm256_cmpgt_epi32(inf, a)));
    } else {
      // bf16 overflow: finite and the rounded result is inf (0x7F80).
      const __m256i hi = _mm256_and_si256(_mm256_cvtepu16_epi32(h), _mm256_set1_epi32(0x7FFF));
      over = _mm256_or_si256(over, _mm256_and_si256(_mm256_cmpeq_epi32(hi, _mm256_set1_epi32(0x7F80)),
                                                    _mm256_cmpgt_epi32(inf, a)));
    }
  }
  const bool any = !_mm256_testz_si256(over, over);
  return encode_scalar(wire, src + i, dst + i, n - i) || any;
}

GF_SIMD inline __m256 decode8(bool fp16, const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (fp16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

GF_SIMD void decode_simd(WireDtype wire, const uint16_t* src, float* dst, size_t n) {
  const bool fp16 = wire == WireDtype::kFloat16;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, decode8(fp16, src + i));
  decode_scalar(wire, src + i, dst + i, n - i);
}

GF_SIMD void decode_accumulate_simd(WireDtype wire, const uint16_t* src, float* dst, size_t n) {
  const bool fp16 = wire == WireDtype::kFloat16;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), decode8(fp16, src + i)));
  }
  decode_accumulate_scalar(wire, src + i, dst + i, n - i);
}
#endif  // GF_CODEC_X86

}  // namespace

// ---- public bulk kernels ----

bool encode_f32(WireDtype wire, const float* src, uint16_t* dst, size_t n) {
  check_wire(wire, "encode_f32");
#if GF_CODEC_X86
  if (use_simd()) return encode_simd(wire, src, dst, n);
#endif
  return encode_scalar(wire, src, dst, n);
}

void decode_f32(WireDtype wire, const uint16_t* src, float* dst, size_t n) {
  check_wire(wire, "decode_f32");
#if GF_CODEC_X86
  if (use_simd()) return decode_simd(wire, src, dst, n);
#endif
  decode_scalar(wire, src, dst, n);
}

void decode_accumulate_f32(WireDtype wire, const uint16_t* src, float* dst, size_t n) {
  check_wire(wire, "decode_accumulate_f32");
#if GF_CODEC_X86
  if (use_simd()) return decode_accumulate_simd(wire, src, dst, n);
#endif
  decode_accumulate_scalar(wire, src, dst, n);
}

const char* codec_impl_name() { return use_simd() ? "avx2-f16c" : "scalar"; }

bool set_codec_simd_enabled(bool enabled) {
  // Enabling is a request: without the CPU features the scalar path stays.
  return simd_switch().exchange(enabled && codec_simd_available());
}

bool codec_simd_available() {
  static const bool available = detect_simd();
  return available;
}

}  // namespace gradflow
