#pragma once

// FP8 formats and conversions (the kernels layer: no LibTorch). The CPU implementation here is
// the reference the CUDA kernels are held to; its bit patterns equal NVIDIA's cuda_fp8.h
// conversions with __NV_SATFINITE.

#include <cstdint>
#include <cstring>

namespace te::fp8 {

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
inline uint8_t e8m0_round_up(float value) {
  if (value != value) return 0xFF;
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7FFFFFFFu) == 0x7F800000u) return 0xFE;
  if (value == 0.0f) return 0x00;
  uint8_t exponent = static_cast<uint8_t>(bits >> 23);
  const uint32_t mantissa = bits & 0x7FFFFFu;
  if (mantissa > 0 && exponent != 0xFE && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return exponent;
}

/// The value 2^(b - 127) (0x00: 2^-127, a subnormal), NaN for 0xFF.
inline float e8m0_to_float(uint8_t b) {
  const uint32_t bits = b == 0xFF ? 0x7FFFFFFFu : b == 0 ? 0x00400000u : uint32_t{b} << 23;
  float out = 0.0f;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

/// Its reciprocal 2^(127 - b), the factor a block is multiplied by before the cast (0xFE: 2^-127,
/// a subnormal; 0xFF: NaN).
inline float e8m0_reciprocal(uint8_t b) {
  const uint32_t bits = b == 0xFF   ? 0x7FFFFFFFu
                        : b == 0xFE ? 0x00400000u
                                    : (254u - uint32_t{b}) << 23;
  float out = 0.0f;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

/// The instruction set quantize and dequantize run with: "avx512", "avx2" or "baseline", the
/// best this CPU runs unless the environment variable TE_FP8_ISA names another it runs (chosen
/// once, at first use; te::Error for one it cannot).
const char* kernel_isa();

}  // namespace te::fp8
