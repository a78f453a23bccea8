#pragma once

// The GEMM every te::nn op without FP8 runs (functional.cpp).

#include <ATen/Tensor.h>

#include <optional>

namespace te::nn::functional::detail {

/// Whether CPU autocast is on in this thread (te/compat.h's two LibTorch APIs).
bool cpu_autocast_on();

/// a @ b for any floating dtype: bf16 / fp16 CPU operands (or CPU autocast to them) without a
/// fast LibTorch kernel on this CPU are multiplied in fp32 from their low-precision values and
/// the result rounded once (what a fp32-accumulating GEMM gives). fp32 CPU GEMMs without autograd
/// run on oneDNN where te-cpp has it (cpu_gemm.h).
at::Tensor mm_any(const at::Tensor& a, const at::Tensor& b);

/// The low-precision dtype a CPU GEMM of a and b would run in without a fast LibTorch kernel
/// (bf16 without AVX-512 or below oneDNN's size, fp16 always, or what CPU autocast makes them),
/// or nullopt: such GEMMs multiply in fp32 and round once (matmul.cpp says why).
std::optional<at::ScalarType> slow_cpu_gemm_dtype(const at::Tensor& a, const at::Tensor& b);

}  // namespace te::nn::functional::detail
