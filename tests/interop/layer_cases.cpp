// Runs te::nn's post-LN TransformerLayer (output_layernorm with residuals from the norms) and
// MultiHeadAttention with RMSNorm qk-norm before RoPE, and writes each case's inputs, every
// parameter, the output and every gradient as JSON for tests/interop/check_layer.py, which holds
// them to Hugging Face transformers' BertLayer and Qwen3Attention with the weights copied across.
//
//   te_interop_layer OUT.json

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cases.h"
#include "te/nn.h"

namespace {

using te::interop::as_json;
using te::interop::randn;
namespace nn = te::nn;

// Every parameter (perturbed from its initial value, so norm scales and biases are not 1 and 0)
// and its gradient.
void perturb(torch::nn::Module& m, uint64_t seed) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.named_parameters()) {
    p.value().add_(randn(p.value().sizes().vec(), ++seed) * 0.2);
  }
}
nlohmann::json params_of(torch::nn::Module& m) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& p : m.named_parameters()) j[p.key()] = as_json(p.value());
  return j;
}
nlohmann::json grads_of(torch::nn::Module& m) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& p : m.named_parameters()) j[p.key()] = as_json(p.value().grad());
  return j;
}

nlohmann::json bert_case(uint64_t seed) {
  const int64_t b = 3, s = 6, hidden = 16;
  const std::vector<int64_t> lengths = {6, 4, 2};
  nn::manual_seed(seed);
  nn::TransformerLayer layer([&] {
    auto made = nn::TransformerLayerOptions(hidden, 24, 4)
                    .output_layernorm(true)
                    .apply_residual_connection_post_layernorm(true)
                    .mlp_activations({"gelu"})
                    .hidden_dropout(0)
                    .intermediate_dropout(0);
    made.self_attention().use_bias(true).scaled_query_init(false).scale_attn_logits(true);
    made.self_attention().layernorm().epsilon(1e-12);
    made.self_attention().attention().attn_mask_type("padding").attention_dropout(0);
    return made;
  }());
  perturb(*layer, seed);
  const at::Tensor len = at::tensor(lengths).view({-1, 1, 1, 1});
  const at::Tensor mask =
      at::arange(s).view({1, 1, 1, s}).ge(len).logical_or(at::arange(s).view({1, 1, s, 1}).ge(len));
  // Padded rows: zero attention in te (TE's), attention to the valid keys in BERT; neither is
  // compared, nor feeds the gradients.
  const at::Tensor valid =
      at::arange(s).view({1, s, 1}).lt(at::tensor(lengths).view({-1, 1, 1})).to(at::kFloat);
  const at::Tensor x0 = randn({b, s, hidden}, seed + 100),
                   dy = randn({b, s, hidden}, seed + 101) * valid;
  const at::Tensor x = x0.clone().requires_grad_(true);
  const at::Tensor y = layer(x, mask);
  torch::autograd::backward({y}, {dy});
  return {{"kind", "bert"},
          {"lengths", lengths},
          {"x", as_json(x0)},
          {"dy", as_json(dy)},
          {"y", as_json(y)},
          {"dx", as_json(x.grad())},
          {"params", params_of(*layer)},
          {"grads", grads_of(*layer)}};
}

nlohmann::json qwen3_case(uint64_t seed) {
  const int64_t b = 2, s = 5, hidden = 32, heads = 4, groups = 2, d = 8;
  nn::manual_seed(seed);
  nn::MultiHeadAttention mha([&] {
    auto made = nn::MultiHeadAttentionOptions(hidden, heads)
                    .input_layernorm(false)
                    .fuse_qkv(false)
                    .scaled_query_init(false)
                    .scale_attn_logits(true)
                    .qk_norm_type("RMSNorm")
                    .qk_norm_eps(1e-6)
                    .qk_norm_before_rope(true);
    made.attention().head_dim(d).num_gqa_groups(groups).attn_mask_type("causal");
    return made;
  }());
  perturb(*mha, seed);
  const double theta = 1000.0;
  const at::Tensor freqs =
      nn::RotaryPositionEmbedding(nn::RotaryPositionEmbeddingOptions(d).rotary_base(theta))
          ->forward(s);
  const at::Tensor x0 = randn({b, s, hidden}, seed + 100), dy = randn({b, s, hidden}, seed + 101);
  const at::Tensor x = x0.clone().requires_grad_(true);
  const at::Tensor y = mha(x, {}, {}, nn::AttentionArgs().rotary_pos_emb(freqs));
  torch::autograd::backward({y}, {dy});
  return {{"kind", "qwen3"},         {"heads", heads},
          {"groups", groups},        {"head_dim", d},
          {"rope_theta", theta},     {"x", as_json(x0)},
          {"dy", as_json(dy)},       {"y", as_json(y)},
          {"dx", as_json(x.grad())}, {"params", params_of(*mha)},
          {"grads", grads_of(*mha)}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: te_interop_layer OUT.json\n");
    return 2;
  }
  nlohmann::json cases = nlohmann::json::array();
  cases.push_back(bert_case(900));
  cases.push_back(bert_case(950));
  cases.push_back(qwen3_case(1000));
  te::interop::write_cases("te_interop_layer", argv[1], cases);
  return 0;
}
