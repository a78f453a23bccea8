// Runs te::nn attention with ALiBi and with softmax sinks and writes each case's inputs,
// weights, outputs and gradients as JSON for tests/interop/check_bias.py, which holds them to
// Hugging Face transformers: ALiBi to BLOOM's attention (BloomAttention with
// build_alibi_tensor, weights copied across) and TE's default slopes to BLOOM's
// _get_alibi_slopes; the "learnable" and "off-by-one" softmax types to gpt-oss's
// eager_attention_forward (its sinks; zero sinks for off-by-one).
//
//   te_interop_bias OUT.json

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
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

// [batch, 1, s, s], true where the key or the query is at or beyond its row's length (right
// padding, as BLOOM's tokenizer pads).
at::Tensor padding_mask(const std::vector<int64_t>& lengths, int64_t s) {
  const at::Tensor len = at::tensor(lengths).view({-1, 1, 1, 1});
  return at::arange(s)
      .view({1, 1, 1, s})
      .ge(len)
      .logical_or(at::arange(s).view({1, 1, s, 1}).ge(len));
}

// The zero-padded rows of `dy`: a padded query's output is zero in te (TE's padded rows) and
// arbitrary in BLOOM, so neither feeds the gradients compared.
at::Tensor valid_rows(const std::vector<int64_t>& lengths, int64_t s) {
  return at::arange(s).view({1, s, 1}).lt(at::tensor(lengths).view({-1, 1, 1})).to(at::kFloat);
}

nlohmann::json alibi_case(int64_t heads, int64_t d, bool fused, uint64_t seed) {
  const int64_t hidden = heads * d, b = 3, s = 6;
  const std::vector<int64_t> lengths = {6, 4, 1};
  nn::MultiHeadAttention mha([&] {
    auto made = nn::MultiHeadAttentionOptions(hidden, heads)
                    .input_layernorm(false)
                    .use_bias(true)
                    .scaled_query_init(false)
                    .scale_attn_logits(true);
    made.attention().attn_mask_type("padding_causal").fused(fused);
    return made;
  }());
  {
    torch::NoGradGuard no_grad;
    mha->qkv_kernel.copy_(randn({hidden, 3, hidden}, seed + 1) * 0.3);
    mha->qkv_bias.copy_(randn({3, hidden}, seed + 2) * 0.1);
    mha->out_kernel.copy_(randn({hidden, hidden}, seed + 3) * 0.3);
    mha->out_bias.copy_(randn({hidden}, seed + 4) * 0.1);
  }
  const at::Tensor x0 = randn({b, s, hidden}, seed + 5);
  const at::Tensor dy = randn({b, s, hidden}, seed + 6) * valid_rows(lengths, s);
  const at::Tensor x = x0.clone().requires_grad_(true);
  const at::Tensor y =
      mha(x, {}, padding_mask(lengths, s), nn::AttentionArgs().core_attention_bias_type("alibi"));
  torch::autograd::backward({y}, {dy});
  return {{"kind", "alibi"},
          {"heads", heads},
          {"fused", fused},
          {"lengths", lengths},
          {"x", as_json(x0)},
          {"dy", as_json(dy)},
          {"qkv_kernel", as_json(mha->qkv_kernel)},
          {"qkv_bias", as_json(mha->qkv_bias)},
          {"out_kernel", as_json(mha->out_kernel)},
          {"out_bias", as_json(mha->out_bias)},
          {"y", as_json(y)},
          {"dx", as_json(x.grad())},
          {"d_qkv_kernel", as_json(mha->qkv_kernel.grad())},
          {"d_qkv_bias", as_json(mha->qkv_bias.grad())},
          {"d_out_kernel", as_json(mha->out_kernel.grad())}};
}

// Sinks under a causal mask, or a padding_causal one whose padded query rows see no key (zero
// in te as in TE; in gpt-oss the sink takes the whole row, so zero too).
nlohmann::json sink_case(const std::string& softmax_type, int64_t groups, bool padding,
                         uint64_t seed) {
  const int64_t b = 2, s = 5, heads = 4, d = 8;
  const std::vector<int64_t> lengths = {5, 3};
  nn::DotProductAttention dpa(nn::DotProductAttentionOptions(heads, d)
                                  .num_gqa_groups(groups)
                                  .attn_mask_type(padding ? "padding_causal" : "causal")
                                  .softmax_type(softmax_type));
  if (softmax_type == "learnable") {
    torch::NoGradGuard no_grad;
    dpa->softmax_offset.copy_(randn({heads}, seed + 1));
  }
  const at::Tensor q0 = randn({b, s, heads, d}, seed + 2), k0 = randn({b, s, groups, d}, seed + 3),
                   v0 = randn({b, s, groups, d}, seed + 4), dy = randn({b, s, heads, d}, seed + 5);
  const at::Tensor q = q0.clone().requires_grad_(true), k = k0.clone().requires_grad_(true),
                   v = v0.clone().requires_grad_(true);
  const at::Tensor y = dpa(q, k, v, padding ? padding_mask(lengths, s) : at::Tensor());
  torch::autograd::backward({y}, {dy});
  nlohmann::json j = {{"kind", "sink"},          {"softmax_type", softmax_type},
                      {"groups", groups},        {"scale", 1.0 / std::sqrt(double(d))},
                      {"q", as_json(q0)},        {"k", as_json(k0)},
                      {"v", as_json(v0)},        {"dy", as_json(dy)},
                      {"y", as_json(y)},         {"dq", as_json(q.grad())},
                      {"dk", as_json(k.grad())}, {"dv", as_json(v.grad())}};
  if (padding) j["lengths"] = lengths;
  if (softmax_type == "learnable") {
    j["sinks"] = as_json(dpa->softmax_offset);
    j["dsinks"] = as_json(dpa->softmax_offset.grad());
  }
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: te_interop_bias OUT.json\n");
    return 2;
  }
  nlohmann::json cases = nlohmann::json::array();
  std::vector<int64_t> slope_heads = {1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 40, 64, 112};
  nlohmann::json slopes = nlohmann::json::object();
  for (int64_t h : slope_heads)
    slopes[std::to_string(h)] = as_json(nn::functional::alibi_slopes(h));
  cases.push_back({{"kind", "slopes"}, {"slopes", slopes}});
  uint64_t seed = 700;
  for (int64_t heads : {4, 6}) {
    for (bool fused : {true, false}) cases.push_back(alibi_case(heads, 4, fused, seed += 10));
  }
  for (const std::string type : {"learnable", "off-by-one"}) {
    for (int64_t groups : {4, 2}) {
      cases.push_back(sink_case(type, groups, (groups == 2) == (type == "learnable"), seed += 10));
    }
  }
  te::interop::write_cases("te_interop_bias", argv[1], cases);
  return 0;
}
