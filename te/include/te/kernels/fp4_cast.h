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

/// The E2M1 code of `value` (round to nearest even, saturating; NaN -> 0x7). Branch-free: the
/// magnitude's code counts the midpoints it passes, a tie staying with the even code (0.25 -> 0,
/// 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4).
inline uint8_t e2m1_round(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  const uint32_t magnitude_bits = bits & 0x7FFFFFFFu;
  float a = 0.0f;
  std::memcpy(&a, &magnitude_bits, sizeof a);
  const int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                   (a >= 3.5f) + (a > 5.0f);
  const bool nan = magnitude_bits > 0x7F800000u;
  return static_cast<uint8_t>(nan ? 0x7 : code | ((bits >> 31) << 3));
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
