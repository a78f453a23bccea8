#pragma once

// Fused attention on meta tensors (te::nn::plan): internal to te::nn.

#include <ATen/Tensor.h>

namespace te::nn::functional::detail {

/// What LibTorch's fused CPU attention (scaled_dot_product_attention's flash kernel) allocates
/// for q, k, v in [batch, heads, seqlen, head_dim] and keeps for backward, on meta tensors: the
/// output and its float log-sum-exp forward, a gradient of each input backward. LibTorch 2.x has
/// no meta form of that kernel (on meta, SDPA takes its math path and counts the probabilities
/// the fused kernel never holds; 2.6 cannot run even that: where.self_out has no meta kernel), so
/// a plan takes this in its place.
at::Tensor meta_fused_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

}  // namespace te::nn::functional::detail
