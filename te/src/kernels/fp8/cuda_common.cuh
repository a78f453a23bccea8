#pragma once

// What the FP8 CUDA kernels share (cast_cuda.cu, block_cuda.cu): error checks, the stream, and
// the device form of cuda_fp8.h's conversions, which the CPU reference matches bit for bit.

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "te/error.h"
#include "te/kernels/fp8_cuda.h"

namespace te::fp8::cuda::detail {

inline void check(cudaError_t status, const char* what) {
  TE_CHECK(status == cudaSuccess, "fp8::cuda::", what, ": ", cudaGetErrorString(status));
}

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

inline __nv_fp8_interpretation_t interpretation(Format f) {
  return f == kE4M3 ? __NV_E4M3 : __NV_E5M2;
}

// RNE, saturating to the largest finite value (__NV_SATFINITE); NaN stays NaN.
__device__ inline uint8_t to_fp8(float v, __nv_fp8_interpretation_t f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, f));
}

__device__ inline float from_fp8(uint8_t c, __nv_fp8_interpretation_t f) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), f);
  return __half2float(__half(h));
}

// Grid-stride launches: enough blocks to fill the device, capped.
inline int blocks_for(int64_t n, int threads) {
  const int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 65535 * 8 ? (b > 0 ? b : 1) : 65535 * 8);
}

}  // namespace te::fp8::cuda::detail
