#pragma once

// The tanh-form gelu, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), TE's default activation,
// with a fused CPU kernel for fp32 and bf16 (gelu_tanh.cpp says why and how it compares with
// at::gelu(x, "tanh")).

#include <ATen/Tensor.h>

namespace te::nn::functional::detail {

/// at::gelu(x, "tanh") with the same autograd (saves x only; the backward is
/// at::gelu_backward(..., "tanh")'s math). Contiguous-or-not CPU fp32 and bf16 tensors take
/// te's fused kernel, computed in fp32 and rounded once; everything else (other dtypes and
/// devices, a backward that builds a graph) is at::gelu's.
at::Tensor gelu_tanh(const at::Tensor& x);

/// Whether gelu_tanh(x) runs te's kernel (a CPU fp32 or bf16 tensor).
bool gelu_tanh_fused(const at::Tensor& x);

}  // namespace te::nn::functional::detail
