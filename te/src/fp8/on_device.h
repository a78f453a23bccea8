#pragma once

// How the FP8 tensor layer reaches the CUDA kernels (te/kernels/fp8_cuda.h): the kernels' format
// enum, the device and stream they run on, and the error where te-cpp was built without CUDA.

#include <ATen/ATen.h>

#include "te/error.h"
#include "te/kernels/fp8_cast.h"

#ifdef TE_WITH_CUDA
#include "te/kernels/fp8_cuda.h"
#endif
#ifdef TE_TORCH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace te::fp8 {

#ifdef TE_WITH_CUDA
inline cuda::Format kernel_format(DType t) { return t == DType::kE4M3 ? cuda::kE4M3 : cuda::kE5M2; }

// Kernels run on `t`'s device and LibTorch's current stream there (with a CUDA LibTorch; the
// default stream of the current device otherwise).
struct OnDevice {
#ifdef TE_TORCH_CUDA
  explicit OnDevice(const at::Tensor& t) : guard(t.device()) {}
  void* stream() const { return c10::cuda::getCurrentCUDAStream().stream(); }
  c10::cuda::CUDAGuard guard;
#else
  explicit OnDevice(const at::Tensor&) {}
  void* stream() const { return nullptr; }
#endif
};
#endif

[[noreturn]] inline void no_cuda(const char* what) {
  TE_FAIL("fp8::", what,
          ": the tensor is on a CUDA device but te-cpp was built without CUDA; "
          "configure with the CUDA toolkit (-DTE_CUDA=ON)");
}

}  // namespace te::fp8
