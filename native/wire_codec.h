// wire_codec.h — conversions between float32 and the 16-bit wire formats
// (IEEE fp16, bfloat16), and the fp32-accumulating reduce of 16-bit data.
// Scalar reference code plus F16C/AVX2 kernels chosen at run time by CPU
// feature detection. Pure functions: no MPI, no configuration, no state
// except the dispatch choice.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common.h"

namespace gradflow {

// ---- scalar conversions (round to nearest even; overflow -> +-inf; NaN kept) ----
uint16_t float_to_half(float f);
float half_to_float(uint16_t h);
uint16_t float_to_bf16(float f);
float bf16_to_float(uint16_t h);

// ---- bulk kernels; `wire` must be kFloat16 or kBFloat16 ----
// dst[i] = encode(src[i]). Returns true if any *finite* input became
// non-finite on the wire (fp16 overflow): the bindings use this flag for
// loss-scale decisions.
bool encode_f32(WireDtype wire, const float* src, uint16_t* dst, size_t n);
// dst[i] = decode(src[i])
void decode_f32(WireDtype wire, const uint16_t* src, float* dst, size_t n);
// dst[i] += decode(src[i])   (the fp32 sum of 16-bit data on arrival)
void decode_accumulate_f32(WireDtype wire, const uint16_t* src, float* dst, size_t n);

// Which implementation the bulk kernels use: "avx2-f16c" or "scalar".
const char* codec_impl_name();
// Force the scalar path (tests compare both); returns the previous setting.
bool set_codec_simd_enabled(bool enabled);
bool codec_simd_available();

}  // namespace gradflow
