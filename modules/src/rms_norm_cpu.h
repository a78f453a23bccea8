#pragma once

// te's CPU kernel for RMSNorm (functional::layer_norm with rms and no bias): one pass over each
// row forward and one backward, where the composite form (square, mean, add, rsqrt, multiply,
// cast, scale; about twice as many ops back) reads and writes the whole activation a dozen
// times. rms_norm_cpu.cpp says what it computes and how it rounds.

#include <ATen/Tensor.h>

namespace te::nn::functional::detail {

/// Whether rms_norm takes te's kernel: x and gamma float32 or bfloat16 alike, on the CPU (or meta:
/// te::nn::plan's shapes and allocations), gamma 1-D over x's last dim.
bool cpu_rms_norm_fused(const at::Tensor& x, const at::Tensor& gamma);

/// x / sqrt(mean(x^2) + epsilon) over the last dim in float32 (float64 for a double x), then
/// scaled: Llama's form (the normalised row rounded to x's dtype, times gamma in that dtype;
/// transformers 5.23.0 models/llama/modeling_llama.py LlamaRMSNorm) or, zero_centered_gamma, by
/// (1 + gamma) in float32 and rounded once (models/gemma2/modeling_gemma2.py Gemma2RMSNorm; TE's
/// kernels). te's kernel where cpu_rms_norm_fused (a backward that builds a graph takes the
/// composite's), else the composite of LibTorch ops.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& gamma, double epsilon,
                    bool zero_centered_gamma);

}  // namespace te::nn::functional::detail
