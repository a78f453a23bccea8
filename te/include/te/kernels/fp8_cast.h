#pragma once

// FP8 formats and conversions (the kernels layer: no LibTorch). The CPU implementation here is
// the reference the CUDA kernels are held to; its bit patterns equal NVIDIA's cuda_fp8.h
// conversions with __NV_SATFINITE.

#include <cstdint>

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

/// The instruction set quantize and dequantize run with: "avx512", "avx2" or "baseline", the
/// best this CPU runs unless the environment variable TE_FP8_ISA names another it runs (chosen
/// once, at first use; te::Error for one it cannot).
const char* kernel_isa();

}  // namespace te::fp8
