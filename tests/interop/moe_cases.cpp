// Runs te::nn's MoE router, its losses and the token permutation (te/nn/moe.h) over TE's
// options and writes each case's inputs, outputs and gradients as JSON for
// tests/interop/check_moe.py, which holds them to TE's reference math (its
// tests/pytorch/test_fused_router.py and test_permutation.py at d0067d0da) and Megatron's
// (moe_utils.py at d98e8a64) in PyTorch.
//
//   te_interop_moe OUT.json

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cases.h"
#include "te/nn/moe.h"

namespace {

namespace F = te::nn::functional;
using te::interop::as_json;
using te::interop::randn;

nlohmann::json router_case(const F::RouterOptions& o, bool bias, uint64_t seed) {
  const int64_t tokens = 12, experts = 16;
  const at::Tensor logits0 = randn({tokens, experts}, seed),
                   dprobs = randn({tokens, experts}, seed + 1);
  const at::Tensor expert_bias = bias ? randn({experts}, seed + 2) * 0.3 : at::Tensor();
  const at::Tensor logits = logits0.clone().requires_grad_(true);
  const F::Routing r = F::topk_with_score_function(logits, o, expert_bias);
  torch::autograd::backward({r.probs}, {dprobs});
  nlohmann::json j = {{"kind", "router"},
                      {"score_function", o.score_function.name()},
                      {"topk", o.topk},
                      {"use_pre_softmax", o.use_pre_softmax},
                      {"num_groups", o.num_groups},
                      {"group_topk", o.group_topk},
                      {"scaling_factor", o.scaling_factor},
                      {"logits", as_json(logits0)},
                      {"dprobs", as_json(dprobs)},
                      {"probs", as_json(r.probs)},
                      {"routing_map", as_json(r.routing_map)},
                      {"dlogits", as_json(logits.grad())}};
  if (bias) j["expert_bias"] = as_json(expert_bias);
  return j;
}

nlohmann::json aux_scores_case(const char* f, uint64_t seed) {
  const at::Tensor logits0 = randn({10, 8}, seed), dscores = randn({10, 8}, seed + 1);
  const at::Tensor logits = logits0.clone().requires_grad_(true);
  const F::Routing s = F::compute_score_for_moe_aux_loss(logits, 3, f);
  torch::autograd::backward({s.probs}, {dscores});
  return {{"kind", "aux_scores"},
          {"score_function", f},
          {"topk", 3},
          {"logits", as_json(logits0)},
          {"dscores", as_json(dscores)},
          {"scores", as_json(s.probs)},
          {"routing_map", as_json(s.routing_map)},
          {"dlogits", as_json(logits.grad())}};
}

// The switch loss, the sequence-level one and the z-loss of one router's logits [b, s, e].
nlohmann::json losses_case(uint64_t seed) {
  const int64_t b = 3, s = 5, e = 6, topk = 2;
  const at::Tensor logits0 = randn({b, s, e}, seed);
  const at::Tensor logits = logits0.clone().requires_grad_(true);
  const F::Routing sc = F::compute_score_for_moe_aux_loss(logits, topk, "softmax");
  const at::Tensor flat = sc.probs.reshape({b * s, e});
  const at::Tensor counts = sc.routing_map.reshape({b * s, e}).to(at::kLong).sum(0);
  const at::Tensor valid = at::arange(b * s).remainder(4).ne(3).view({b, s});
  const at::Tensor aux = F::moe_aux_loss(flat, counts, b * s, topk, 0.01);
  const at::Tensor seq = F::moe_sequence_aux_loss(sc.probs, sc.routing_map, topk, 0.02);
  const at::Tensor z = F::moe_z_loss(logits, 0.001);
  const at::Tensor z_valid = F::moe_z_loss(logits, 0.001, valid);
  torch::autograd::backward({aux + 3 * seq + 5 * z + 7 * z_valid});
  return {{"kind", "losses"},
          {"topk", topk},
          {"logits", as_json(logits0)},
          {"valid", as_json(valid)},
          {"aux", aux.item<double>()},
          {"seq_aux", seq.item<double>()},
          {"z", z.item<double>()},
          {"z_valid", z_valid.item<double>()},
          {"dlogits", as_json(logits.grad())}};
}

// Tokens through a mask map with probabilities, each row scaled as an expert would, and back.
nlohmann::json permute_mask_case(uint64_t seed) {
  const int64_t tokens = 9, hidden = 5, experts = 6;
  F::RouterOptions o;
  o.topk = 2;
  const F::Routing r = F::topk_with_score_function(randn({tokens, experts}, seed), o);
  const at::Tensor x0 = randn({tokens, hidden}, seed + 1), dy = randn({tokens, hidden}, seed + 2);
  const at::Tensor x = x0.clone().requires_grad_(true);
  const at::Tensor probs = r.probs.detach().clone().requires_grad_(true);
  const F::Permutation p = F::moe_permute_with_probs(x, probs, r.routing_map);
  const at::Tensor scale = randn({p.tokens.size(0), 1}, seed + 3);
  const at::Tensor y = F::moe_unpermute(p.tokens * scale, p, probs);
  const at::Tensor y_summed = F::moe_unpermute(p.tokens * scale, p);  // no merging weights
  const at::Tensor dpermuted_probs = randn({p.tokens.size(0)}, seed + 4);
  torch::autograd::backward({y, p.probs}, {dy, dpermuted_probs});
  return {{"kind", "permute_mask"},
          {"x", as_json(x0)},
          {"probs", as_json(r.probs)},
          {"routing_map", as_json(r.routing_map)},
          {"row_scale", as_json(scale)},
          {"dy", as_json(dy)},
          {"dpermuted_probs", as_json(dpermuted_probs)},
          {"permuted", as_json(p.tokens)},
          {"permuted_probs", as_json(p.probs)},
          {"y", as_json(y)},
          {"y_summed", as_json(y_summed)},
          {"dx", as_json(x.grad())},
          {"dprobs", as_json(probs.grad())}};
}

// Capacity 6 of 16 tokens x top-2 over 4 experts (factor 0.75): the "probs" policy.
nlohmann::json drop_case(uint64_t seed) {
  F::RouterOptions o;
  o.topk = 2;
  const F::Routing r = F::topk_with_score_function(randn({16, 4}, seed), o);
  const F::Routing kept = F::moe_drop_tokens(r, 2, 0.75, "probs");
  return {{"kind", "drop"},
          {"topk", 2},
          {"capacity_factor", 0.75},
          {"probs", as_json(r.probs)},
          {"routing_map", as_json(r.routing_map)},
          {"kept_probs", as_json(kept.probs)},
          {"kept_map", as_json(kept.routing_map)}};
}

nlohmann::json sort_chunks_case(uint64_t seed) {
  const std::vector<int64_t> splits = {2, 0, 3, 5}, order = {3, 1, 0, 2};
  const at::Tensor x0 = randn({10, 3}, seed), dy = randn({10, 3}, seed + 1);
  const at::Tensor x = x0.clone().requires_grad_(true);
  const at::Tensor y = F::moe_sort_chunks_by_index(x, splits, order);
  torch::autograd::backward({y}, {dy});
  return {{"kind", "sort_chunks"},  {"split_sizes", splits}, {"sorted_index", order},
          {"x", as_json(x0)},       {"dy", as_json(dy)},     {"y", as_json(y)},
          {"dx", as_json(x.grad())}};
}

// Tokens through an index map (top-k expert ids), the last rows dropped when num_out_tokens says.
nlohmann::json permute_index_case(int64_t num_out_tokens, uint64_t seed) {
  const int64_t tokens = 8, hidden = 4, experts = 5, topk = 3;
  const at::Tensor indices = std::get<1>(at::topk(randn({tokens, experts}, seed), topk, -1));
  const at::Tensor x0 = randn({tokens, hidden}, seed + 1), dy = randn({tokens, hidden}, seed + 2);
  const at::Tensor merging0 = at::softmax(randn({tokens, topk}, seed + 3), -1);
  const at::Tensor x = x0.clone().requires_grad_(true);
  const at::Tensor merging = merging0.clone().requires_grad_(true);
  const F::Permutation p = F::moe_permute_indices(x, indices, experts, num_out_tokens);
  const at::Tensor scale = randn({p.tokens.size(0), 1}, seed + 4);
  const at::Tensor y = F::moe_unpermute(p.tokens * scale, p, merging);
  torch::autograd::backward({y}, {dy});
  return {{"kind", "permute_index"},
          {"num_out_tokens", num_out_tokens},
          {"x", as_json(x0)},
          {"indices", as_json(indices)},
          {"merging", as_json(merging0)},
          {"row_scale", as_json(scale)},
          {"dy", as_json(dy)},
          {"permuted", as_json(p.tokens)},
          {"y", as_json(y)},
          {"dx", as_json(x.grad())},
          {"dmerging", as_json(merging.grad())}};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: te_interop_moe OUT.json\n");
    return 2;
  }
  nlohmann::json cases = nlohmann::json::array();
  uint64_t seed = 700;
  for (const char* f : {"softmax", "sigmoid", "sqrtsoftplus"}) {
    const bool softmax = std::string(f) == "softmax";
    for (const bool pre : softmax ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      for (const bool groups : {false, true}) {
        for (const bool bias :
             softmax ? std::vector<bool>{false} : std::vector<bool>{false, true}) {
          F::RouterOptions o;
          o.topk = 4;
          o.use_pre_softmax = pre;
          o.score_function = f;
          if (groups) {
            o.num_groups = 4;
            o.group_topk = 2;
          }
          o.scaling_factor = groups ? 2.5 : 0.0;
          cases.push_back(router_case(o, bias, seed += 10));
        }
      }
    }
    F::RouterOptions one;  // top-1: no normalisation of the chosen score
    one.topk = 1;
    one.score_function = f;
    cases.push_back(router_case(one, !softmax, seed += 10));
    cases.push_back(aux_scores_case(f, seed += 10));
  }
  cases.push_back(losses_case(seed += 10));
  cases.push_back(permute_mask_case(seed += 10));
  cases.push_back(permute_index_case(0, seed += 10));
  cases.push_back(permute_index_case(17, seed += 10));
  cases.push_back(drop_case(seed += 10));
  cases.push_back(sort_chunks_case(seed += 10));
  te::interop::write_cases("te_interop_moe", argv[1], cases);
  return 0;
}
