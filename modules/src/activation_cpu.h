#pragma once

// te's CPU kernels for the tanh-form gelu, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (TE's
// default activation), and SiLU, x sigmoid(x) (Llama's and Qwen's MLP), for fp32 and bf16
// (activation_cpu.cpp says why and how they compare with LibTorch's).

#include <ATen/Tensor.h>

namespace te::nn::functional::detail {

/// Whether gelu_tanh(x) and silu(x) run te's kernels (a CPU fp32 or bf16 tensor).
bool cpu_activation_fused(const at::Tensor& x);

/// at::gelu(x, "tanh") with the same autograd (saves x only; the backward is
/// at::gelu_backward(..., "tanh")'s math). Contiguous-or-not CPU fp32 and bf16 tensors take
/// te's fused kernel, computed in fp32 and rounded once; everything else (other dtypes and
/// devices, a backward that builds a graph) is at::gelu's.
at::Tensor gelu_tanh(const at::Tensor& x);

/// at::silu(x) with the same autograd, on te's kernels where gelu_tanh takes them.
at::Tensor silu(const at::Tensor& x);

}  // namespace te::nn::functional::detail
