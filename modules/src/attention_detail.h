#pragma once

// What MultiHeadAttention (multi_head_attention.cpp) takes from DotProductAttention's file
// (attention.cpp), where it is instantiated for at::Tensor and DTensor.

#include <ATen/Tensor.h>

#include "te/distributed/dtensor.h"
#include "te/nn/attention.h"

namespace te::nn::detail {

/// DotProductAttention over the KV cache `args` carries: the new tokens' keys and values join
/// the cache, and each sequence's queries attend over its cached keys (bottom-right diagonal).
template <typename T>
T cached_attention(const DotProductAttentionImpl& self, const T& query, const T& key,
                   const T& value, const AttentionArgs& args);
extern template at::Tensor cached_attention<at::Tensor>(const DotProductAttentionImpl&,
                                                        const at::Tensor&, const at::Tensor&,
                                                        const at::Tensor&, const AttentionArgs&);
extern template DTensor cached_attention<DTensor>(const DotProductAttentionImpl&, const DTensor&,
                                                  const DTensor&, const DTensor&,
                                                  const AttentionArgs&);

}  // namespace te::nn::detail
