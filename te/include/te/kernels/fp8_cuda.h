#pragma once

// CUDA FP8 kernels (built when the CUDA toolkit is found; TE_WITH_CUDA). Raw device pointers, no
// LibTorch: the tensor layer (te/fp8.h) dispatches here for CUDA tensors. `stream` is a
// cudaStream_t (null: the default stream). Scales, scale_invs and amaxes are device pointers to
// one fp32 each, so no call synchronises with the host. Errors throw te::Error naming the call.

#include <cstdint>

namespace te::fp8::cuda {

enum Format { kE4M3, kE5M2 };

/// Devices visible to this process (0 without a driver or a GPU; never throws).
int device_count();
/// True when device 0 runs FP8 tensor-core GEMMs (compute capability 8.9 or newer).
bool fp8_gemm_supported();

/// out[i] = fp8(in[i] * *scale) (RNE, saturate to finite, as cuda_fp8.h's __NV_SATFINITE);
/// *amax = max(*amax, max |in[i]|) when amax is not null.
void quantize(const float* in, uint8_t* out, int64_t n, const float* scale, float* amax,
              Format format, void* stream);
/// out[i] = value(in[i]) * *scale_inv.
void dequantize(const uint8_t* in, float* out, int64_t n, const float* scale_inv, Format format,
                void* stream);
/// in is [rows, cols] row-major: out gets its codes, out_t the codes of its transpose
/// [cols, rows]; amax as quantize.
void cast_transpose(const float* in, uint8_t* out, uint8_t* out_t, int64_t rows, int64_t cols,
                    const float* scale, float* amax, Format format, void* stream);
/// d [m, n] = (a [m, k] @ b [k, n]) * *a_scale_inv * *b_scale_inv, all row-major, fp32 out,
/// through cuBLASLt's FP8 GEMM (sm_89+; not both operands E5M2; k and n multiples of 16). b comes
/// transposed: b_t is [n, k] row-major (the only layout FP8 cuBLASLt takes).
/// `fast_accumulation` keeps the tensor cores' FP8-precision accumulator over all of k (faster;
/// TE's forward GEMM); without it partial sums are promoted to fp32 (TE's gradient GEMMs).
/// Each thread holds, per device, one handle, a 32 MiB workspace per stream and a plan per shape
/// (descriptors and the algorithm chosen for the pointers' real alignment), taken from a
/// process-wide pool and given back when the thread ends.
void gemm(const uint8_t* a, Format a_format, const float* a_scale_inv, const uint8_t* b_t,
          Format b_format, const float* b_scale_inv, float* d, int64_t m, int64_t n, int64_t k,
          bool fast_accumulation, void* stream);

}  // namespace te::fp8::cuda
