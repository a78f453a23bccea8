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

namespace te::fp8 {

/// The largest E2M1 magnitude.
constexpr float kE2M1Max = 6.0f;

/// The E2M1 code of `value` (round to nearest even, saturating; NaN -> 0x7).
inline uint8_t e2m1_round(float value) {
  if (value != value) return 0x7;
  const bool negative = value < 0.0f || (value == 0.0f && 1.0f / value < 0.0f);
  const float a = negative ? -value : value;
  // The midpoints between neighbours; a tie goes to the even code (0, 1.0, 2.0, 4.0).
  const uint8_t code = a <= 0.25f   ? 0
                       : a < 0.75f  ? 1
                       : a <= 1.25f ? 2
                       : a < 1.75f  ? 3
                       : a <= 2.5f  ? 4
                       : a < 3.5f   ? 5
                       : a <= 5.0f  ? 6
                                    : 7;
  return static_cast<uint8_t>(code | (negative ? 0x8 : 0x0));
}

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

}  // namespace te::fp8
