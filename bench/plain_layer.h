#pragma once

// The te::nn blocks written as plain LibTorch ops, for the benchmarks that compare the two: the
// same math on the module's parameters (copied by name), so outputs can be checked equal first.

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <stdexcept>
#include <string>

#include "te/compat.h"

namespace te::bench {

using Params = std::map<std::string, at::Tensor>;

/// The module's parameters by name, copied as leaves (requiring grad) for the plain version.
inline Params copy_parameters(const torch::nn::Module& module) {
  Params out;
  for (const auto& p : module.named_parameters()) {
    out[p.key()] = p.value().detach().clone().requires_grad_(true);
  }
  return out;
}

inline at::Tensor param(const Params& params, const std::string& name) {
  const auto it = params.find(name);
  if (it == params.end()) throw std::runtime_error("bench_modules: no parameter " + name);
  return it->second;
}

constexpr double kEps = 1e-6;

// ---- the same math in plain LibTorch -----------------------------------------------------------

inline at::Tensor plain_layer_norm(const at::Tensor& x, const at::Tensor& g, const at::Tensor& b) {
  return at::layer_norm(x, {x.size(-1)}, g, b, kEps);
}

// Causal self attention on [batch, seq, hidden] with a fused [hidden, 3, hidden] kernel, logits
// unscaled (the query kernel carries 1/sqrt(d), as te's default). `sdpa`: through LibTorch's
// scaled_dot_product_attention with is_causal, as a plain-LibTorch user writes it on a GPU.
inline at::Tensor plain_attention(const at::Tensor& ln, const at::Tensor& w_qkv,
                                  const at::Tensor& w_out, int64_t heads, bool sdpa = false) {
  const int64_t b = ln.size(0), s = ln.size(1), h = ln.size(2), d = h / heads;
  const at::Tensor qkv = at::matmul(ln, w_qkv.reshape({h, 3 * h})).view({b, s, 3, heads, d});
  const at::Tensor q = qkv.select(2, 0).transpose(1, 2), k = qkv.select(2, 1).transpose(1, 2),
                   v = qkv.select(2, 2).transpose(1, 2);
#if TE_TORCH_VERSION_AT_LEAST(2, 1)
  if (sdpa) {
    const at::Tensor out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, true, 1.0);
    return at::matmul(out.transpose(1, 2).reshape({b, s, h}), w_out);
  }
#else
  if (sdpa) throw std::runtime_error("plain_attention: SDPA with a scale needs LibTorch 2.1+");
#endif
  const at::Tensor causal = at::ones({s, s}, ln.options().dtype(at::kBool)).triu(1);
  const at::Tensor logits = at::matmul(q, k.transpose(-1, -2)).masked_fill(causal, -1e10);
  const at::Tensor probs = at::softmax(logits, -1, at::kFloat).to(ln.scalar_type());
  const at::Tensor out = at::matmul(probs, v).transpose(1, 2).reshape({b, s, h});
  return at::matmul(out, w_out);
}

inline at::Tensor plain_mlp(const at::Tensor& x, const Params& p, const std::string& prefix) {
  const at::Tensor ln = plain_layer_norm(x, param(p, prefix + "layernorm.scale"),
                                         param(p, prefix + "layernorm.ln_bias"));
  const at::Tensor wi = param(p, prefix + "wi_kernel");
  const at::Tensor h = at::gelu(at::matmul(ln, wi.reshape({wi.size(0), -1})), "tanh");
  return at::matmul(h, param(p, prefix + "wo_kernel"));
}

inline at::Tensor plain_mha(const at::Tensor& x, const Params& p, const std::string& prefix,
                            int64_t heads, bool sdpa = false) {
  const at::Tensor ln = plain_layer_norm(x, param(p, prefix + "layernorm.scale"),
                                         param(p, prefix + "layernorm.ln_bias"));
  return plain_attention(ln, param(p, prefix + "qkv_kernel"), param(p, prefix + "out_kernel"),
                         heads, sdpa);
}

/// A pre-norm TransformerLayer without biases: x + attention(ln(x)), then + mlp(ln(.)).
inline at::Tensor plain_layer(const at::Tensor& x, const Params& p, int64_t heads,
                              bool sdpa = false) {
  const at::Tensor h = x + plain_mha(x, p, "self_attention.", heads, sdpa);
  return h + plain_mlp(h, p, "mlp.");
}

}  // namespace te::bench
