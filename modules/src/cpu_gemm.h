#pragma once

// te::nn's 2-D fp32 CPU GEMMs that record no autograd graph (inference: generation, serving,
// embeddings, evaluation; and those inside te's own autograd functions) run on oneDNN's matmul
// where te-cpp was built with it (cpu_gemm.cpp says why); everything else stays on LibTorch
// (matmul.h).

#include <ATen/Tensor.h>

#include <optional>

namespace te::nn::functional::detail {

/// x @ w (+ bias) by oneDNN: x [..., K], w [K, N] (rows or columns contiguous: a kernel or a
/// transposed table), bias [N] or undefined -> [..., N]; or nullopt where oneDNN does not take
/// it: not built with oneDNN or TE_CPU_GEMM=libtorch, not fp32 CPU tensors, CPU autocast on, an
/// autograd graph to record (grad mode on and an operand requiring grad), an empty product, or
/// another layout of w.
std::optional<at::Tensor> onednn_linear(const at::Tensor& x, const at::Tensor& w,
                                        const at::Tensor& bias = {});

}  // namespace te::nn::functional::detail
