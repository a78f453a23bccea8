// Runs te::nn::DotProductAttention over every mask type, sliding windows, both diagonals, more
// and fewer queries than keys, GQA, a per-head arbitrary mask, a value head dim of its own
// (kv_channels) and packed sequences (thd, with and without padded offsets), on the fused and the
// unfused path, and writes each case's inputs, outputs and gradients as JSON for
// tests/interop/check_attention.py, which holds them to PyTorch's scaled_dot_product_attention.
//
//   te_interop_attention OUT.json

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cases.h"
#include "te/nn.h"

namespace {

using te::interop::as_json;
using te::interop::randn;

// TE's encoder padding mask: [batch, 1, sq, sk], true where the key or the query is padding.
at::Tensor padding_mask(const std::vector<int64_t>& lengths, int64_t sq, int64_t sk) {
  const at::Tensor len = at::tensor(lengths).view({-1, 1, 1, 1});
  return at::arange(sk)
      .view({1, 1, 1, sk})
      .ge(len)
      .logical_or(at::arange(sq).view({1, 1, sq, 1}).ge(len));
}

// Runs the case's q, k, v through `options` on the fused and the unfused path, recording the
// backend, the output and the gradients of dy in c["fused"] and c["unfused"].
void run_both_paths(nlohmann::json& c, const te::nn::DotProductAttentionOptions& options,
                    const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0,
                    const at::Tensor& dy, const at::Tensor& mask,
                    const te::nn::AttentionArgs& args) {
  for (const bool fused : {true, false}) {
    te::nn::DotProductAttention dpa(te::nn::DotProductAttentionOptions(options).fused(fused));
    dpa->eval();
    at::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
               v = v0.clone().requires_grad_();
    const at::Tensor y = dpa(q, k, v, mask, args);
    torch::autograd::backward({y}, {dy});
    c[fused ? "fused" : "unfused"] = {{"backend", dpa->fused_backend(q0, k0, v0, mask, args)},
                                      {"y", as_json(y)},
                                      {"dq", as_json(q.grad())},
                                      {"dk", as_json(k.grad())},
                                      {"dv", as_json(v.grad())}};
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: te_interop_attention OUT.json\n");
    return 2;
  }
  using te::nn::WindowSize;
  const std::vector<int64_t> lengths = {6, 3, 1};
  nlohmann::json cases = nlohmann::json::array();
  uint64_t seed = 100;
  for (const std::string type : {"no_mask", "causal", "causal_bottom_right", "padding",
                                 "padding_causal", "padding_causal_bottom_right", "arbitrary"}) {
    const bool causal = type.find("causal") != std::string::npos;
    for (const auto& [sq, sk] : std::vector<std::pair<int64_t, int64_t>>{{5, 5}, {3, 6}, {6, 3}}) {
      for (const std::optional<WindowSize>& window :
           {std::optional<WindowSize>{},
            std::optional<WindowSize>{WindowSize{2, causal ? 0 : 1}}}) {
        const int64_t b = 3, h = 4, g = 2, d = 8;
        const at::Tensor q0 = randn({b, sq, h, d}, ++seed), k0 = randn({b, sk, g, d}, ++seed),
                         v0 = randn({b, sk, g, d}, ++seed), dy = randn({b, sq, h, d}, ++seed);
        at::Tensor mask;
        if (type == "arbitrary") {
          at::Generator gen = at::detail::createCPUGenerator(++seed);
          mask = at::rand({b, h, sq, sk}, gen).lt(0.3);
          mask.select(0, 1).select(0, 2).select(0, 0).fill_(true);  // a row with no key
        } else if (type.rfind("padding", 0) == 0) {
          mask = padding_mask(lengths, sq, sk);
        }
        nlohmann::json c = {{"type", type},     {"sq", sq},           {"sk", sk},
                            {"scale", 0.3},     {"lengths", lengths}, {"q", as_json(q0)},
                            {"k", as_json(k0)}, {"v", as_json(v0)},   {"dy", as_json(dy)}};
        if (window) c["window"] = {window->first, window->second};
        if (mask.defined()) c["mask"] = as_json(mask);
        run_both_paths(c,
                       te::nn::DotProductAttentionOptions(h, d)
                           .attn_mask_type(type)
                           .window_size(window)
                           .num_gqa_groups(g)
                           .scale_factor(0.3),
                       q0, k0, v0, dy, mask, {});
        cases.push_back(c);
      }
    }
  }
  // TE's kv_channels = (qk dim, v dim): values of their own head dim.
  for (const std::string type : {"no_mask", "causal_bottom_right"}) {
    const int64_t b = 2, sq = 5, sk = 6, h = 4, g = 2, d = 8, dv = 6;
    const at::Tensor q0 = randn({b, sq, h, d}, ++seed), k0 = randn({b, sk, g, d}, ++seed),
                     v0 = randn({b, sk, g, dv}, ++seed), dy = randn({b, sq, h, dv}, ++seed);
    nlohmann::json c = {{"type", type},     {"sq", sq},         {"sk", sk},
                        {"scale", 0.3},     {"q", as_json(q0)}, {"k", as_json(k0)},
                        {"v", as_json(v0)}, {"dy", as_json(dy)}};
    run_both_paths(c,
                   te::nn::DotProductAttentionOptions(h, d)
                       .head_dim_v(dv)
                       .attn_mask_type(type)
                       .num_gqa_groups(g)
                       .scale_factor(0.3),
                   q0, k0, v0, dy, {}, {});
    cases.push_back(c);
  }
  // Packed sequences (qkv_format thd), queries and keys of different lengths, with and without
  // free slots between the sequences (cu_seqlens_*_padded): check_attention.py runs each
  // sequence alone through SDPA.
  const std::vector<int64_t> lq = {5, 2, 3}, lk = {4, 3, 6};
  for (const std::string type : {"padding", "padding_causal", "padding_causal_bottom_right"}) {
    const bool causal = type != "padding";
    for (const std::optional<WindowSize>& window :
         {std::optional<WindowSize>{}, std::optional<WindowSize>{WindowSize{2, causal ? 0 : 1}}}) {
      for (const int64_t gap : {0, 2}) {
        std::vector<int64_t> cu_q = {0}, cu_k = {0}, pad_q = {0}, pad_k = {0};
        for (std::size_t i = 0; i < lq.size(); ++i) {
          cu_q.push_back(cu_q.back() + lq[i]);
          cu_k.push_back(cu_k.back() + lk[i]);
          pad_q.push_back(pad_q.back() + lq[i] + gap);
          pad_k.push_back(pad_k.back() + lk[i] + gap);
        }
        const int64_t tq = pad_q.back(), tk = pad_k.back(), h = 4, g = 2, d = 8;
        const at::Tensor q0 = randn({tq, h, d}, ++seed), k0 = randn({tk, g, d}, ++seed),
                         v0 = randn({tk, g, d}, ++seed), dy = randn({tq, h, d}, ++seed);
        nlohmann::json c = {{"type", type},      {"format", "thd"},  {"sq", tq},
                            {"sk", tk},          {"scale", 0.3},     {"starts_q", pad_q},
                            {"starts_k", pad_k}, {"lengths_q", lq},  {"lengths_k", lk},
                            {"q", as_json(q0)},  {"k", as_json(k0)}, {"v", as_json(v0)},
                            {"dy", as_json(dy)}};
        if (window) c["window"] = {window->first, window->second};
        auto args =
            te::nn::AttentionArgs().cu_seqlens_q(at::tensor(cu_q)).cu_seqlens_kv(at::tensor(cu_k));
        if (gap > 0) {
          args.cu_seqlens_q_padded(at::tensor(pad_q)).cu_seqlens_kv_padded(at::tensor(pad_k));
        }
        run_both_paths(c,
                       te::nn::DotProductAttentionOptions(h, d)
                           .attn_mask_type(type)
                           .window_size(window)
                           .num_gqa_groups(g)
                           .scale_factor(0.3)
                           .qkv_format("thd"),
                       q0, k0, v0, dy, {}, args);
        cases.push_back(c);
      }
    }
  }
  te::interop::write_cases("te_interop_attention", argv[1], cases);
  return 0;
}
