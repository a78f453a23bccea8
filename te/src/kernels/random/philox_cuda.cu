// The CUDA form of layout-invariant dropout: each thread takes elements of the local box, finds
// their global row-major number and applies the multiplier of that element's Philox word. The
// rounds and the mapping are philox_core.h's, which the CPU kernel uses too.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "philox_core.h"
#include "te/error.h"
#include "te/kernels/philox.h"

namespace te::kernels::cuda {

namespace {

// The box by value: kernels take no host pointers.
struct Box {
  int ndim;
  int64_t global_stride[kMaxDropoutDims];  // row-major strides of the global tensor
  int64_t offsets[kMaxDropoutDims];
  int64_t lengths[kMaxDropoutDims];
};

template <typename T>
__device__ float load(const T* p, int64_t i) {
  return static_cast<float>(p[i]);
}
template <>
__device__ float load<__half>(const __half* p, int64_t i) {
  return __half2float(p[i]);
}
template <>
__device__ float load<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
template <typename T>
__device__ T store(float v) {
  return static_cast<T>(v);
}
template <>
__device__ __half store<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __nv_bfloat16 store<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

template <typename T>
__global__ void dropout_kernel(Box box, int64_t n, uint64_t seed, uint64_t call, uint32_t threshold,
                               float scale, const T* in, T* out) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    // e's index in the box (row-major), then its number in the global tensor.
    int64_t rest = e, g = 0;
    for (int d = box.ndim - 1; d >= 0; --d) {
      const int64_t i = rest % box.lengths[d];
      rest /= box.lengths[d];
      g += (box.offsets[d] + i) * box.global_stride[d];
    }
    const bool keep = philox::word_of(static_cast<uint64_t>(g), seed, call) >= threshold;
    // A product, as the CPU path's x * mask (a dropped inf or NaN stays NaN there too).
    out[e] = store<T>(load(in, e) * (keep ? scale : 0.0f));
  }
}

}  // namespace

void dropout_apply(const GlobalBox& box, uint64_t seed, uint64_t call, uint32_t threshold,
                   float scale, const void* in, void* out, int dtype, void* stream) {
  TE_CHECK(box.ndim >= 1 && box.ndim <= kMaxDropoutDims, "dropout on CUDA takes 1 to ",
           kMaxDropoutDims, " dims, got ", box.ndim);
  Box b{};
  b.ndim = box.ndim;
  int64_t n = 1, stride = 1;
  for (int d = box.ndim - 1; d >= 0; --d) {
    b.global_stride[d] = stride;
    stride *= box.global_sizes[d];
    b.offsets[d] = box.offsets[d];
    b.lengths[d] = box.lengths[d];
    n *= box.lengths[d];
  }
  if (n == 0) return;
  const int threads = 256;
  const int64_t wanted = (n + threads - 1) / threads;
  const int blocks = static_cast<int>(wanted < 65535 * 8 ? wanted : 65535 * 8);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (dtype) {
    case 0:
      dropout_kernel<<<blocks, threads, 0, s>>>(b, n, seed, call, threshold, scale,
                                                static_cast<const float*>(in),
                                                static_cast<float*>(out));
      break;
    case 1:
      dropout_kernel<<<blocks, threads, 0, s>>>(b, n, seed, call, threshold, scale,
                                                static_cast<const __half*>(in),
                                                static_cast<__half*>(out));
      break;
    case 2:
      dropout_kernel<<<blocks, threads, 0, s>>>(b, n, seed, call, threshold, scale,
                                                static_cast<const __nv_bfloat16*>(in),
                                                static_cast<__nv_bfloat16*>(out));
      break;
    default:
      TE_FAIL("dropout on CUDA takes float, half or bfloat16 tensors (dtype code ", dtype, ")");
  }
  const cudaError_t e = cudaGetLastError();
  TE_CHECK(e == cudaSuccess, "dropout on CUDA: the kernel did not start: ", cudaGetErrorString(e));
}

}  // namespace te::kernels::cuda
