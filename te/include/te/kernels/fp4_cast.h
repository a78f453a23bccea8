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

#include "te/kernels/fp8_cast.h"

namespace te::fp8 {

/// The largest E2M1 magnitude.
constexpr float kE2M1Max = 6.0f;
/// NVFP4's two levels at their largest: E4M3's 448 times E2M1's 6 (2688).
constexpr float kNvfp4Max = 448.0f * kE2M1Max;

/// The E2M1 code of `value` (round to nearest even, saturating; NaN -> 0x7) in the low 4 bits of
/// a 32-bit word: every step is a 32-bit lane operation, so a loop of them vectorizes as wide as
/// the floats. Branch-free, on the float's bits, as an FP8 cast with 1 mantissa bit and bias 1: a
/// magnitude of at least 1 rounds its mantissa to one bit on the integer bits (adding half a
/// quantum minus one, plus the lowest kept bit: ties go to even), the exponent rebiased; below 1
/// the float unit rounds |x| + 2^22, whose quantum is E2M1's 0.5, leaving the code in the low
/// bits; beyond 6 it saturates.
TE_KERNEL_FN uint32_t e2m1_code(float value) {
  const uint32_t bits = float_bits(value);
  const uint32_t magnitude_bits = bits & 0x7FFFFFFFu;
  const uint32_t rounded = magnitude_bits + ((1u << 21) - 1u) + ((magnitude_bits >> 22) & 1u);
  const uint32_t normal = (rounded >> 22) - (126u << 1);  // wraps below 1: unused there
  constexpr uint32_t kMagicBits = 149u << 23;             // 2^22
  const uint32_t sum_bits = float_bits(bits_float(magnitude_bits) + bits_float(kMagicBits));
  uint32_t code = magnitude_bits < 0x3F800000u ? sum_bits - kMagicBits : normal;
  code = code > 7u ? 7u : code;
  const bool nan = magnitude_bits > 0x7F800000u;
  return nan ? 0x7u : (code | ((bits >> 31) << 3));
}

/// e2m1_code as a byte.
TE_KERNEL_FN uint8_t e2m1_round(float value) { return static_cast<uint8_t>(e2m1_code(value)); }

/// The value of the E2M1 code in the low nibble of `code`.
TE_KERNEL_FN float e2m1_to_float(uint8_t code) {
  // Exponent e (bits 2-1), mantissa m (bit 0): m / 2 below e = 1, else (1 + m / 2) 2^(e - 1).
  const int e = (code >> 1) & 0x3, m = code & 0x1;
  const float magnitude =
      e == 0 ? 0.5f * static_cast<float>(m)
             : (1.0f + 0.5f * static_cast<float>(m)) * static_cast<float>(1 << (e - 1));
  return (code & 0x8) ? -magnitude : magnitude;
}

/// Stochastic rounding (TE's NVFP4 gradients, cvt.rs.satfinite.e2m1x4.f32): `value` rounded to
/// one of its two E2M1 neighbours, up (away from zero) when `random` (a uniform 32-bit word) is
/// below (|value| - low) / (high - low) * 2^32, so the expected result is the value itself;
/// exact values stay; saturation and NaN as e2m1_round.
TE_KERNEL_FN uint8_t e2m1_round_stochastic(float value, uint32_t random) {
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

/// Entry (i, j) of NVFP4's wgrad transform D H / 4 (16 x 16): row i of the Sylvester Hadamard
/// matrix (H[i][j] = (-1)^popcount(i & j)) times TE's sign i (-1 where bit i of 0xD7E8 is set:
/// [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]; get_wgrad_sign_vector in
/// pytorch/custom_recipes/reference_nvfp4.py at d0067d0da), over sqrt(16).
TE_KERNEL_FN float hadamard16_entry(int i, int j) {
  int v = i & j;  // the parity of its bits
  v ^= v >> 2;
  v ^= v >> 1;
  const float sign = ((0xD7E8 >> i) & 1) ? -1.0f : 1.0f;
  return sign * ((v & 1) ? -0.25f : 0.25f);
}

/// NVFP4's tensor encode scale S_enc for the tensor amax (TE: cast/nvfp4/core_nvfp4.cuh
/// compute_global_encode_scaling_factor_FP4 at d0067d0da): 448 * 6 / amax, fminf with FLT_MAX
/// (a NaN amax gives FLT_MAX), 1 when the amax is 0 or S_enc is 0.
TE_KERNEL_FN float nvfp4_encode_scale(float amax) {
  const float q = kNvfp4Max / amax;
  float s = q < FLT_MAX ? q : FLT_MAX;  // fminf: NaN gives FLT_MAX
  if (amax == 0.0f || s == 0.0f) s = 1.0f;
  return s;
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
