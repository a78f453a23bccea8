#pragma once

// FP8 formats and conversions (the kernels layer: no LibTorch). The CPU implementation here is
// the reference the CUDA kernels are held to; its bit patterns equal NVIDIA's cuda_fp8.h
// conversions with __NV_SATFINITE.

#include <cfloat>
#include <cstdint>
#include <cstring>

// The scalar rules below are written once for the CPU reference and the CUDA kernels (host and
// device functions under nvcc), so both compute the same bits.
#ifdef __CUDACC__
#define TE_KERNEL_FN __host__ __device__ inline
#else
#define TE_KERNEL_FN inline
#endif

namespace te::fp8 {

/// A float's bit pattern, and the float of a bit pattern.
TE_KERNEL_FN uint32_t float_bits(float value) {
  uint32_t bits = 0;
  memcpy(&bits, &value, sizeof bits);
  return bits;
}
TE_KERNEL_FN float bits_float(uint32_t bits) {
  float value = 0.0f;
  memcpy(&value, &bits, sizeof value);
  return value;
}

/// E4M3: 4 exponent bits (bias 7), 3 mantissa bits, no infinities, max 448, NaN 0x7F/0xFF.
/// E5M2: 5 exponent bits (bias 15), 2 mantissa bits, max 57344, infinities 0x7C/0xFC.
enum class DType { kE4M3, kE5M2 };

/// Largest finite value of the format: 448 or 57344.
constexpr float max_finite(DType t) { return t == DType::kE4M3 ? 448.0f : 57344.0f; }

/// Rounds to nearest, ties to even; values beyond the largest finite value (and infinities)
/// saturate to it with their sign; NaN becomes 0x7F.
uint8_t cast_to_fp8(float value, DType type);

/// The exact value of an FP8 bit pattern (NaN, and for E5M2 infinities, as such).
float cast_from_fp8(uint8_t bits, DType type);

/// out[i] = cast_to_fp8(in[i] * scale); returns max |in[i]| (the amax; NaN if any input is NaN).
float quantize(const float* in, uint8_t* out, int64_t n, float scale, DType type);

/// out[i] = cast_from_fp8(in[i]) * scale_inv.
void dequantize(const uint8_t* in, float* out, int64_t n, float scale_inv, DType type);

/// max(amax, max |x[i]| over n elements), NaN skipped (fmaxf's rule, as TE's block kernels take
/// a block's amax).
float fold_amax(const float* x, int64_t n, float amax);

/// Block-scaled casts, a row of n floats at a time in blocks of `width` consecutive elements
/// (the last one shorter at a ragged edge): fold_block_amaxes folds each block's magnitudes into
/// amax[b] (fold_amax's rule), quantize_blocks_row casts block b with scale[b] (out[i] =
/// cast_to_fp8(in[i] * scale[b])). One call per row, so a row's blocks cost no call each.
void fold_block_amaxes(const float* in, int64_t n, int64_t width, float* amax);
void quantize_blocks_row(const float* in, uint8_t* out, int64_t n, int64_t width,
                         const float* scale, DType type);

/// E8M0, MXFP8's block scale (OCP Microscaling Formats v1.0, §5.4.1): 8 exponent bits, no sign,
/// no mantissa; bits b stand for 2^(b - 127), 0xFF for NaN. The rules below are TE's
/// (NVIDIA/TransformerEngine d0067d0da6cb01811b8072a7d304f0e00344ce2b,
/// transformer_engine/common/util/ptx_arch_spec.cuh float_to_e8m0 and util/ptx.cuh exp2f,
/// exp2f_rcp; Blackwell's cvt.rp.satfinite.ue8m0x2.f32 gives the same bits).
///
/// A non-negative value rounded UP to a power of two, saturating at 2^127 (0xFE): 0 -> 0x00,
/// NaN -> 0xFF, inf -> 0xFE; the subnormals up to 2^-127 -> 0x00, above it -> 0x01.
TE_KERNEL_FN uint8_t e8m0_round_up(float value) {
  if (value != value) return 0xFF;
  const uint32_t bits = float_bits(value);
  if ((bits & 0x7FFFFFFFu) == 0x7F800000u) return 0xFE;
  if (value == 0.0f) return 0x00;
  uint8_t exponent = static_cast<uint8_t>(bits >> 23);
  const uint32_t mantissa = bits & 0x7FFFFFu;
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return exponent;
}

/// The value 2^(b - 127) (0x00: 2^-127, a subnormal), NaN for 0xFF.
TE_KERNEL_FN float e8m0_to_float(uint8_t b) {
  return bits_float(b == 0xFF ? 0x7FFFFFFFu : b == 0 ? 0x00400000u : uint32_t{b} << 23);
}

/// Its reciprocal 2^(127 - b), the factor a block is multiplied by before the cast (0xFE: 2^-127,
/// a subnormal; 0xFF: NaN).
TE_KERNEL_FN float e8m0_reciprocal(uint8_t b) {
  return bits_float(b == 0xFF ? 0x7FFFFFFFu : b == 0xFE ? 0x00400000u : (254u - uint32_t{b}) << 23);
}

/// TE's compute_scale_from_amax (transformer_engine/common/recipe/recipe_common.cuh at
/// d0067d0da): amax floored at `epsilon`; 1 when the amax is 0, infinite or NaN; else
/// fp8_max / amax in fp32, FLT_MAX where that overflows, and with `power_2` the mantissa cleared
/// (rounding down to a power of two). The scalar rule of Float8BlockScaling's blocks and of the
/// current-scaling options; scales_from_amax (te/fp8.h) applies it to a tensor of amaxes.
TE_KERNEL_FN float scale_from_amax(float amax, float fp8_max, bool power_2, float epsilon) {
  if (amax < epsilon) amax = epsilon;  // NaN stays NaN
  const uint32_t magnitude = float_bits(amax) & 0x7FFFFFFFu;
  if (magnitude >= 0x7F800000u || amax == 0.0f) return 1.0f;  // inf, NaN, 0
  float scale = fp8_max / amax;
  if ((float_bits(scale) & 0x7FFFFFFFu) == 0x7F800000u) scale = FLT_MAX;
  // Sign and exponent: rounds down to a power of two.
  if (power_2) scale = bits_float(float_bits(scale) & 0xFF800000u);
  return scale;
}

/// The instruction set quantize and dequantize run with: "avx512", "avx2" or "baseline", the
/// best this CPU runs unless the environment variable TE_FP8_ISA names another it runs (chosen
/// once, at first use; te::Error for one it cannot).
const char* kernel_isa();

}  // namespace te::fp8
