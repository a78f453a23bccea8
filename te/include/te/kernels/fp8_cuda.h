#pragma once

// CUDA FP8 kernels (built when the CUDA toolkit is found; TE_WITH_CUDA). Raw device pointers, no
// LibTorch: the tensor layer (te/fp8.h) dispatches here for CUDA tensors. `stream` is a
// cudaStream_t (null: the default stream). Scales, scale_invs and amaxes are device pointers to
// one fp32 each, so no call synchronises with the host. Errors throw te::Error naming the call.

#include <cstdint>

namespace te::fp8::cuda {

enum Format { kE4M3, kE5M2 };
/// The element type of a cast's input or a GEMM's output: the high-precision side of FP8.
enum Real { kFloat32, kBFloat16, kFloat16 };

/// Devices visible to this process (0 without a driver or a GPU; never throws).
int device_count();
/// True when device 0 runs FP8 tensor-core GEMMs (compute capability 8.9 or newer).
bool fp8_gemm_supported();

/// out[i] = fp8(in[i] * *scale) (RNE, saturate to finite, as cuda_fp8.h's __NV_SATFINITE);
/// *amax = max(*amax, max |in[i]|) when amax is not null.
/// `in` holds n elements of `in_type` (read as they are: a bf16 input is not widened in memory
/// first; the codes are those of its exact fp32 values).
void quantize(const void* in, Real in_type, uint8_t* out, int64_t n, const float* scale,
              float* amax, Format format, void* stream);
inline void quantize(const float* in, uint8_t* out, int64_t n, const float* scale, float* amax,
                     Format format, void* stream) {
  quantize(in, kFloat32, out, n, scale, amax, format, stream);
}
/// out[i] = value(in[i]) * *scale_inv.
void dequantize(const uint8_t* in, float* out, int64_t n, const float* scale_inv, Format format,
                void* stream);
/// in is [rows, cols] row-major: out gets its codes, out_t the codes of its transpose
/// [cols, rows]; amax as quantize.
/// 64 x 64 tiles, vector loads and 4-byte stores where rows and cols are multiples of 4.
void cast_transpose(const void* in, Real in_type, uint8_t* out, uint8_t* out_t, int64_t rows,
                    int64_t cols, const float* scale, float* amax, Format format, void* stream);
inline void cast_transpose(const float* in, uint8_t* out, uint8_t* out_t, int64_t rows,
                           int64_t cols, const float* scale, float* amax, Format format,
                           void* stream) {
  cast_transpose(in, kFloat32, out, out_t, rows, cols, scale, amax, format, stream);
}
/// d [m, n] = (a [m, k] @ b [k, n]) * *a_scale_inv * *b_scale_inv, all row-major, d of d_type
/// (the fp32 result rounded once: a bf16 layer gets its output without an fp32 pass),
/// through cuBLASLt's FP8 GEMM (sm_89+; not both operands E5M2; k and n multiples of 16). b comes
/// transposed: b_t is [n, k] row-major (the only layout FP8 cuBLASLt takes).
/// `fast_accumulation` keeps the tensor cores' FP8-precision accumulator over all of k (faster;
/// TE's forward GEMM); without it partial sums are promoted to fp32 (TE's gradient GEMMs).
/// Each thread holds, per device, one handle, a 32 MiB workspace per stream and a plan per shape
/// (descriptors and the algorithm chosen for the pointers' real alignment), taken from a
/// process-wide pool and given back when the thread ends.
void gemm(const uint8_t* a, Format a_format, const float* a_scale_inv, const uint8_t* b_t,
          Format b_format, const float* b_scale_inv, void* d, Real d_type, int64_t m, int64_t n,
          int64_t k, bool fast_accumulation, void* stream);
inline void gemm(const uint8_t* a, Format a_format, const float* a_scale_inv, const uint8_t* b_t,
                 Format b_format, const float* b_scale_inv, float* d, int64_t m, int64_t n,
                 int64_t k, bool fast_accumulation, void* stream) {
  gemm(a, a_format, a_scale_inv, b_t, b_format, b_scale_inv, d, kFloat32, m, n, k,
       fast_accumulation, stream);
}

/// Block-scaled casts, the device form of the CPU reference (te::fp8::quantize_blocks,
/// quantize_mx, quantize_nvfp4 in te/fp8.h), bit for bit: the same scalar rules
/// (te/kernels/fp8_cast.h, fp4_cast.h) and cuda_fp8.h's conversions. `in` is [rows, cols]
/// row-major fp32, blocked along cols; a block at a ragged edge is scaled by its own elements.
/// Scales are written row-major, one row per block row.
///
/// Float8BlockScaling: blocks of 1 x 128 (tile_rows 1) or tiles of 128 x 128 (tile_rows 128);
/// block amax fmaxf over |x| (NaN skipped), scale = scale_from_amax(amax, max finite, power_2,
/// epsilon), scale_inv [ceil(rows / tile_rows), ceil(cols / 128)] = 1 / scale, codes
/// fp8(x * scale).
void quantize_blocks(const float* in, uint8_t* codes, float* scale_inv, int64_t rows, int64_t cols,
                     int tile_rows, Format format, bool power_2, float epsilon, void* stream);
/// MXFP8: blocks of 1 x 32; E8M0 scales [rows, ceil(cols / 32)] = e8m0_round_up(amax / max
/// finite), codes fp8(x * e8m0_reciprocal(scale)).
void quantize_mx(const float* in, uint8_t* codes, uint8_t* scales, int64_t rows, int64_t cols,
                 Format format, void* stream);
/// *amax = max(*amax, max |in[i]|) with NaN skipped (fmaxf's rule: NVFP4's tensor amax).
void fold_amax(const float* in, int64_t n, float* amax, void* stream);
/// NVFP4: E2M1 codes packed two a byte ([rows, cols / 2], the even element in the low nibble; cols
/// even), E4M3 scales per 1 x 16 block (tile_rows 1, [rows, ceil(cols / 16)]) or 16 x 16 tile
/// (tile_rows 16, [ceil(rows / 16), ceil(cols / 16)]), from the tensor amax at `amax` (device,
/// fp32): S_enc = nvfp4_encode_scale(amax), a block's scale e4m3(min(block amax * S_enc / 6,
/// FLT_MAX)), its codes e2m1(x * min(1 / (scale * (1 / S_enc)), FLT_MAX)). `stochastic` rounds
/// element r * cols + c with the Philox word of (seed, call) (te/kernels/philox.h word_of).
void quantize_nvfp4(const float* in, uint8_t* packed, uint8_t* scales, int64_t rows, int64_t cols,
                    int tile_rows, const float* amax, bool stochastic, uint64_t seed, uint64_t call,
                    void* stream);
/// Their inverses: out [rows, cols] = value(code) * the block's scale_inv (fp32, blocks of
/// `width` along cols, tile_rows rows a block row); MXFP8: value(code) * 2^(scale - 127); NVFP4:
/// value(code) * (value(scale) * amax * (1 / 2688)).
void dequantize_blocks(const uint8_t* codes, const float* scale_inv, float* out, int64_t rows,
                       int64_t cols, int tile_rows, int width, Format format, void* stream);
void dequantize_mx(const uint8_t* codes, const uint8_t* scales, float* out, int64_t rows,
                   int64_t cols, Format format, void* stream);
void dequantize_nvfp4(const uint8_t* packed, const uint8_t* scales, const float* amax, float* out,
                      int64_t rows, int64_t cols, int tile_rows, void* stream);
/// NVFP4's random Hadamard transform of 16-element blocks (te::fp8::hadamard16): out [rows, cols]
/// = each block of in times (D H / 4), in fp32, summed in the CPU reference's order (cols a
/// multiple of 16).
void hadamard16(const float* in, float* out, int64_t rows, int64_t cols, void* stream);

}  // namespace te::fp8::cuda
