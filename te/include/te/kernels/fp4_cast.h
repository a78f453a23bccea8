#pragma once

// FP4 E2M1, NVFP4's element type (the kernels layer: no LibTorch). Codes are 4 bits: sign (bit 3),
// 2 exponent bits (bias 1), 1 mantissa bit; the magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (OCP
// Microscaling Formats v1.0, §5.3.3: no infinities, no NaN). Two codes share a byte, the element
// with the even index in the low nibble (TE's fp4e2m1x2 and its reference's cast_to_fp4x2).
//
// Conversions as CUDA's cuda_fp4.h __nv_cvt_float_to_fp4 (cudaRoundNearest) gives them, the
// conversion TE's NVFP4 kernels make (cvt.rn.satfinite.e2m1x2.f32): round to nearest, ties to
// even; magnitudes beyond 6 (infinities too) saturate to 6 with their sign; NaN becomes +6
// ("NaN input values result in positive MAXNORM", cuda_fp4.h).

#include <cstdint>
#include <cstring>

namespace te::fp8 {

/// The largest E2M1 magnitude.
constexpr float kE2M1Max = 6.0f;

/// The E2M1 code of `value` (round to nearest even, saturating; NaN -> 0x7) in the low 4 bits of
/// a 32-bit word: every step is a 32-bit lane operation, so a loop of them vectorizes as wide as
/// the floats. Branch-free, on the float's bits, as an FP8 cast with 1 mantissa bit and bias 1: a
/// magnitude of at least 1 rounds its mantissa to one bit on the integer bits (adding half a
/// quantum minus one, plus the lowest kept bit: ties go to even), the exponent rebiased; below 1
/// the float unit rounds |x| + 2^22, whose quantum is E2M1's 0.5, leaving the code in the low
/// bits; beyond 6 it saturates.
inline uint32_t e2m1_code(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  const uint32_t magnitude_bits = bits & 0x7FFFFFFFu;
  const uint32_t rounded = magnitude_bits + ((1u << 21) - 1u) + ((magnitude_bits >> 22) & 1u);
  const uint32_t normal = (rounded >> 22) - (126u << 1);  // wraps below 1: unused there
  float a = 0.0f, sum = 0.0f;
  std::memcpy(&a, &magnitude_bits, sizeof a);
  constexpr uint32_t kMagicBits = 149u << 23;  // 2^22
  float magic = 0.0f;
  std::memcpy(&magic, &kMagicBits, sizeof magic);
  sum = a + magic;
  uint32_t sum_bits = 0;
  std::memcpy(&sum_bits, &sum, sizeof sum_bits);
  uint32_t code = magnitude_bits < 0x3F800000u ? sum_bits - kMagicBits : normal;
  code = code > 7u ? 7u : code;
  const bool nan = magnitude_bits > 0x7F800000u;
  return nan ? 0x7u : (code | ((bits >> 31) << 3));
}

/// e2m1_code as a byte.
inline uint8_t e2m1_round(float value) { return static_cast<uint8_t>(e2m1_code(value)); }

/// The value of the E2M1 code in the low nibble of `code`.
inline float e2m1_to_float(uint8_t code) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitude[code & 0x7];
  return (code & 0x8) ? -m : m;
}

/// Stochastic rounding (TE's NVFP4 gradients, cvt.rs.satfinite.e2m1x4.f32): `value` rounded to
/// one of its two E2M1 neighbours, up (away from zero) when `random` (a uniform 32-bit word) is
/// below (|value| - low) / (high - low) * 2^32, so the expected result is the value itself;
/// exact values stay; saturation and NaN as e2m1_round.
inline uint8_t e2m1_round_stochastic(float value, uint32_t random) {
  if (value != value) return 0x7;
  const bool negative = value < 0.0f || (value == 0.0f && 1.0f / value < 0.0f);
  const float a = negative ? -value : value;
  uint8_t code = 7;
  if (a < kE2M1Max) {
    // The codes are ordered: find the neighbour below (low <= a < high).
    uint8_t low = 0;
    while (low < 7 && e2m1_to_float(static_cast<uint8_t>(low + 1)) <= a) ++low;
    const double lo = e2m1_to_float(low), hi = e2m1_to_float(static_cast<uint8_t>(low + 1));
    const double up = (a - lo) / (hi - lo);  // in [0, 1)
    code = static_cast<double>(random) < up * 4294967296.0 ? static_cast<uint8_t>(low + 1) : low;
  }
  return static_cast<uint8_t>(code | (negative ? 0x8 : 0x0));
}

/// NVFP4's per-block work for one block row (te::fp8::quantize_nvfp4; vectorized per instruction
/// set as te/kernels/fp8_cast.h's casts): for each of nb block amaxes, its E4M3 scale
/// scale[b] = e4m3(min(amax[b] * block_factor, FLT_MAX)) and the factor its elements are
/// multiplied by before rounding, encode[b] = min(1 / (value(scale[b]) * s_dec), FLT_MAX).
void nvfp4_block_scales(const float* amax, int64_t nb, float block_factor, float s_dec,
                        uint8_t* scale, float* encode);
/// The packed codes of a row of n floats in blocks of 16: e2m1_round(in[i] * encode[i / 16]),
/// two a byte. n must be even (quantize_nvfp4 checks it): an odd n's last element is not cast.
void nvfp4_quantize_row(const float* in, uint8_t* packed, int64_t n, const float* encode);

}  // namespace te::fp8
