// Runs te::nn::DotProductAttention over every mask type, sliding windows, both diagonals, more
// and fewer queries than keys, GQA and a per-head arbitrary mask, on the fused and the unfused
// path, and writes each case's inputs, outputs and gradients as JSON for
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
        for (const bool fused : {true, false}) {
          te::nn::DotProductAttention dpa(te::nn::DotProductAttentionOptions(h, d)
                                              .attn_mask_type(type)
                                              .window_size(window)
                                              .num_gqa_groups(g)
                                              .scale_factor(0.3)
                                              .fused(fused));
          dpa->eval();
          at::Tensor q = q0.clone().requires_grad_(), k = k0.clone().requires_grad_(),
                     v = v0.clone().requires_grad_();
          const at::Tensor y = dpa(q, k, v, mask);
          torch::autograd::backward({y}, {dy});
          c[fused ? "fused" : "unfused"] = {{"backend", dpa->fused_backend(q0, k0, v0, mask)},
                                            {"y", as_json(y)},
                                            {"dq", as_json(q.grad())},
                                            {"dk", as_json(k.grad())},
                                            {"dv", as_json(v.grad())}};
        }
        cases.push_back(c);
      }
    }
  }
  te::interop::write_cases("te_interop_attention", argv[1], cases);
  return 0;
}
