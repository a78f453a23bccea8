#pragma once

// te's fused attention for CPU tensors (flash_attention.cpp): internal to te::nn.

#include <ATen/Tensor.h>

#include <cstdint>
#include <tuple>
#include <utility>

namespace te::nn::functional {
struct AttentionCall;
}

namespace te::nn::functional::detail {

/// The keys each query row sees: query i sees key j when
/// i + offset - left <= j <= i + offset + right, a bound < 0 being none (MaskSpec's window).
struct KeyWindow {
  int64_t offset = 0, left = -1, right = -1;
};

/// Whether flash_attention computes attention() for this call on these [batch, seqlen, heads,
/// head_dim] tensors: CPU (or meta: te::nn::plan) float32, bfloat16 or float16 q, k and v, `fused`
/// on, a vanilla softmax, no bias, soft cap, logits constraint, dropout in training or mask tensor
/// (no mask, the causal types and sliding windows: what KeyWindow says).
bool flash_attention_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionCall& call);

/// The window `call.spec` gives queries of seqlen sq over sk keys.
KeyWindow key_window(const AttentionCall& call, int64_t sq, int64_t sk);

/// softmax(scale q k^T, hiding what `window` hides) v for q [b, sq, h, d], k [b, sk, hkv, d] and
/// v [b, sk, hkv, dv] (h a multiple of hkv: query head i reads key/value head i / (h / hkv)),
/// computed by blocks of queries and keys with a running softmax in float32 (the probabilities
/// are never held whole), as FlashAttention-2 does; backward recomputes each block's
/// probabilities from the log-sum-exp. Returns the output [b, sq, h, dv] in q's dtype and the
/// log-sum-exp of each row's scaled logits [b, h, sq] in float32 (-inf for a row that sees no
/// key, whose output is zero and which passes no gradient). Both are differentiable in q, k and
/// v (a gradient of the log-sum-exp is what merging partial results by it needs).
std::pair<at::Tensor, at::Tensor> flash_attention(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, double scale,
                                                  KeyWindow window);

/// The forward kernel alone, outside autograd: the output [b, sq, h, dv] and the log-sum-exp
/// [b, h, sq], both float32 (what flash_attention computes before rounding the output).
std::pair<at::Tensor, at::Tensor> flash_forward(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, double scale,
                                                KeyWindow window);

/// The backward kernel alone, outside autograd: dq [b, sq, h, d], dk [b, sk, hkv, d] and dv
/// [b, sk, hkv, dv], float32, for the keys `k`, `v` given each query row's `out` and `lse` over
/// every key it sees. When those are the merged result of several blocks of keys (a context
/// parallel ring's steps, merged by log-sum-exp), this is that block's share of the gradients,
/// and the shares sum to the whole's. `dlse` (the log-sum-exp's gradient) may be undefined.
std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& dlse, double scale,
    KeyWindow window);

}  // namespace te::nn::functional::detail
