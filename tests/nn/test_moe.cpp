// The MoE router, its losses and the token permutation (te/nn/moe.h): their defining properties
// and bad input here; tests/interop/check_moe.py holds the same functions to TE's and
// Megatron's reference math in PyTorch.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "../expect_error.h"
#include "nn_test_util.h"
#include "te/fp8.h"
#include "te/nn/dense.h"
#include "te/nn/grouped_linear.h"
#include "te/nn/init.h"
#include "te/nn/moe.h"

namespace te::nn {
namespace {

namespace F = functional;
using test::Close;

// A bool tensor from 0/1 values (LibTorch 1.13's at::tensor takes no bools).
at::Tensor mask(const std::vector<int64_t>& values) { return at::tensor(values).to(at::kBool); }

// Per row of `map`, how many experts are routed.
at::Tensor routed_per_row(const at::Tensor& map) { return map.to(at::kLong).sum(-1); }

TEST(MoeRouter, EachScoreFunctionRoutesTopkWithTesProbabilities) {
  const at::Tensor logits = test::randn({2, 5, 8}, 1);
  for (const char* f : {"softmax", "sigmoid", "sqrtsoftplus"}) {
    for (const bool pre : {false, true}) {
      SCOPED_TRACE(::testing::Message() << f << (pre ? " pre" : " post"));
      F::RouterOptions o;
      o.topk = 3;
      o.use_pre_softmax = pre;
      o.score_function = f;
      const F::Routing r = F::topk_with_score_function(logits, o);
      ASSERT_EQ(r.probs.sizes(), logits.sizes());
      EXPECT_TRUE(routed_per_row(r.routing_map).eq(3).all().item<bool>());
      EXPECT_TRUE(r.probs.ne(0).eq(r.routing_map).all().item<bool>());
      // The chosen experts are the 3 largest logits (every score function is increasing).
      const at::Tensor best = std::get<1>(at::topk(logits, 3, -1));
      EXPECT_TRUE(r.routing_map.gather(-1, best).all().item<bool>());
      const at::Tensor sums = r.probs.sum(-1);
      if (o.score_function == ScoreFunction::kSoftmax && pre) {
        const at::Tensor full = at::softmax(logits, -1);
        EXPECT_TRUE(Close(r.probs, full * r.routing_map));
      } else {
        EXPECT_TRUE(Close(sums, at::ones_like(sums)));  // normalised over the chosen
      }
    }
  }
}

TEST(MoeRouter, ExpertBiasChoosesButDoesNotWeigh) {
  const at::Tensor logits = test::leaf(test::randn({6, 4}, 2));
  F::RouterOptions o;
  o.topk = 1;
  o.score_function = ScoreFunction::kSigmoid;
  o.scaling_factor = 2.5;
  // A large bias on expert 3 sends every token there; the weight is its own sigmoid, scaled.
  const at::Tensor bias = test::leaf(at::tensor({0.0f, 0.0f, 0.0f, 100.0f}));
  const F::Routing r = F::topk_with_score_function(logits, o, bias);
  EXPECT_TRUE(r.routing_map.select(1, 3).all().item<bool>());
  EXPECT_TRUE(Close(r.probs.select(1, 3), at::sigmoid(logits.select(1, 3)) * 2.5));
  r.probs.sum().backward();
  EXPECT_TRUE(logits.grad().defined());
  EXPECT_FALSE(bias.grad().defined());  // the bias steers, it is not learned by this loss
}

TEST(MoeRouter, GroupLimitedTopkStaysInTheBestGroups) {
  // 8 experts in 4 groups of 2. The two best logits lie in groups 0 and 1, but one group is
  // chosen, scored by the sum of its best topk / group_topk = 2: group 2 (2.8 + 2.7).
  const at::Tensor logits =
      at::tensor({3.0f, -3.0f, 2.9f, -3.0f, 2.8f, 2.7f, -2.0f, -2.0f}).view({1, 8});
  F::RouterOptions o;
  o.topk = 2;
  o.num_groups = 4;
  o.group_topk = 1;
  const F::Routing r = F::topk_with_score_function(logits, o);
  EXPECT_TRUE(r.routing_map.equal(mask({0, 0, 0, 0, 1, 1, 0, 0}).view({1, 8})));
  o.num_groups = o.group_topk = 0;
  EXPECT_TRUE(F::topk_with_score_function(logits, o).routing_map.equal(
      mask({1, 0, 1, 0, 0, 0, 0, 0}).view({1, 8})));
}

TEST(MoeRouter, GradientsReachTheLogitsInTheirDtype) {
  const at::Tensor logits = test::randn({4, 6}, 3).to(at::kBFloat16).requires_grad_(true);
  F::RouterOptions o;
  o.topk = 2;
  const F::Routing r = F::topk_with_score_function(logits, o);
  EXPECT_EQ(r.probs.scalar_type(), at::kBFloat16);
  torch::autograd::backward({(r.probs.to(at::kFloat) * test::randn({4, 6}, 4)).sum()});
  ASSERT_TRUE(logits.grad().defined());
  EXPECT_EQ(logits.grad().scalar_type(), at::kBFloat16);
  // Post-softmax: only the chosen logits get a gradient.
  EXPECT_TRUE(logits.grad().ne(0).le(r.routing_map).all().item<bool>());
}

TEST(MoeLosses, AuxLossIsTheSwitchFormula) {
  const at::Tensor probs = at::tensor({0.6f, 0.4f, 0.0f, 0.0f, 0.7f, 0.3f}).view({2, 3});
  const at::Tensor counts = at::tensor({1, 2, 1});
  // Σ_e P_e c_e = 0.6 + 2.2 + 0.3 = 3.1; times E coeff / (topk T²) = 3 · 0.01 / (2 · 4).
  EXPECT_NEAR(F::moe_aux_loss(probs, counts, 2, 2, 0.01).item<double>(), 3.1 * 0.03 / 8, 1e-8);
}

TEST(MoeLosses, SequenceAuxLossIsTheMeanOfEachSequences) {
  const at::Tensor logits = test::randn({3, 7, 5}, 5);
  const F::Routing s = F::compute_score_for_moe_aux_loss(logits, 2, "softmax");
  double sum = 0;
  for (int64_t b = 0; b < 3; ++b) {
    sum += F::moe_aux_loss(s.probs[b], s.routing_map[b].to(at::kLong).sum(0), 7, 2, 0.1)
               .item<double>();
  }
  EXPECT_NEAR(F::moe_sequence_aux_loss(s.probs, s.routing_map, 2, 0.1).item<double>(), sum / 3,
              1e-7);
}

TEST(MoeLosses, ZLossCountsTheValidTokens) {
  const at::Tensor logits = test::randn({4, 3}, 6);
  const at::Tensor z = at::logsumexp(logits, -1).square();
  EXPECT_NEAR(F::moe_z_loss(logits, 0.5).item<double>(), z.mean().item<double>() * 0.5, 1e-7);
  const at::Tensor valid = mask({1, 0, 1, 0});
  EXPECT_NEAR(F::moe_z_loss(logits, 0.5, valid).item<double>(),
              (z[0] + z[2]).item<double>() / 2 * 0.5, 1e-7);
}

TEST(MoeCapacity, DroppingKeepsTheCapacityByPolicy) {
  EXPECT_EQ(F::moe_expert_capacity(6, 2, 4, 1.0), 3);
  EXPECT_EQ(F::moe_expert_capacity(6, 1, 4, 1.0, 5), 5);
  // Six tokens all routed to expert 0 (top-1 of 2 experts): capacity ceil(6/2 · 1.0) = 3.
  const at::Tensor p = at::tensor({0.9f, 0.6f, 0.8f, 0.7f, 0.95f, 0.5f});
  F::Routing r{at::stack({p, at::zeros_like(p)}, 1), at::stack({p.gt(0), p.lt(0)}, 1)};
  const F::Routing by_probs = F::moe_drop_tokens(r, 1, 1.0, DropPolicy::kProbs);
  EXPECT_TRUE(by_probs.routing_map.select(1, 0).equal(mask({1, 0, 1, 0, 1, 0})));
  EXPECT_TRUE(Close(by_probs.probs.select(1, 0), p * by_probs.routing_map.select(1, 0)));
  const F::Routing by_position = F::moe_drop_tokens(r, 1, 1.0, DropPolicy::kPosition);
  EXPECT_TRUE(by_position.routing_map.select(1, 0).equal(mask({1, 1, 1, 0, 0, 0})));
  // "probs" ranks the routed tokens only: dense scores (an aux-loss Routing) on expert 1 do not
  // take its places from the tokens routed there.
  const at::Tensor dense_scores = at::stack({p, at::full_like(p, 0.99f)}, 1);
  const at::Tensor only_first = at::stack({p.lt(0.85), p.ge(0.85)}, 1);
  const F::Routing scored =
      F::moe_drop_tokens({dense_scores, only_first}, 1, 1.0, DropPolicy::kProbs);
  // Expert 0 had 4 routed tokens for 3 places (token 5, the lowest, dropped); expert 1 keeps
  // both of its own.
  EXPECT_TRUE(
      scored.routing_map.equal(at::stack({mask({0, 1, 1, 1, 0, 0}), mask({1, 0, 0, 0, 1, 0})}, 1)));
  // Padded: every expert takes exactly its capacity of rows (expert 1's with probability 0).
  const F::Routing padded = F::moe_drop_tokens(r, 1, 1.0, DropPolicy::kPosition, true);
  EXPECT_TRUE(padded.routing_map.to(at::kLong).sum(0).equal(at::tensor({3, 3})));
  EXPECT_EQ(padded.probs.select(1, 1).abs().sum().item<float>(), 0.0f);
}

TEST(MoePermute, MaskAndIndexMapsGroupByExpertAndUndo) {
  const at::Tensor x = test::randn({5, 4}, 7);
  const at::Tensor logits = test::randn({5, 6}, 8);
  F::RouterOptions o;
  o.topk = 2;
  const F::Routing r = F::topk_with_score_function(logits, o);
  const F::Permutation by_mask = F::moe_permute_with_probs(x, r.probs, r.routing_map);
  ASSERT_EQ(by_mask.tokens.size(0), 10);
  const at::Tensor counts = r.routing_map.to(at::kLong).sum(0);
  EXPECT_EQ(by_mask.rows_per_expert,
            std::vector<int64_t>(counts.data_ptr<int64_t>(), counts.data_ptr<int64_t>() + 6));
  // Each row is its token, its probability the token's for that expert.
  EXPECT_TRUE(by_mask.tokens.equal(x.index_select(0, by_mask.source)));
  // Identity experts: merging by the probabilities (summing to 1) gives x back.
  EXPECT_TRUE(Close(F::moe_unpermute(by_mask.tokens, by_mask, r.probs), x));
  EXPECT_TRUE(Close(F::moe_unpermute(by_mask.tokens * by_mask.probs.unsqueeze(1), by_mask), x));
  // The index map of the same choice gives the same rows in the same order.
  const at::Tensor indices = std::get<1>(at::topk(logits, 2, -1));
  const F::Permutation by_index = F::moe_permute_indices(x, indices, 6);
  EXPECT_TRUE(by_index.tokens.equal(by_mask.tokens));
  EXPECT_EQ(by_index.rows_per_expert, by_mask.rows_per_expert);
  EXPECT_TRUE(Close(F::moe_unpermute(by_index.tokens, by_index, r.probs.gather(1, indices)), x));
}

TEST(MoePermute, AlignmentPadsEachExpertWithZeroRows) {
  const at::Tensor x = test::randn({5, 3}, 9);
  const at::Tensor map = at::tensor({1, 0, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0}).view({5, 3});
  const at::Tensor probs = at::sigmoid(test::randn({5, 3}, 17)) * map;
  const F::Permutation p = F::moe_permute_with_probs(x, probs, map, 4);
  EXPECT_EQ(p.rows_per_expert, (std::vector<int64_t>{4, 4, 4}));  // 3, 1, 2 routed, each to 4
  // Each block: the expert's tokens in token order, then its padding rows (zero, probability 0).
  EXPECT_TRUE(p.source.equal(at::tensor({0, 1, 2, -1, 2, -1, -1, -1, 0, 3, -1, -1})));
  const at::Tensor pad = p.source.lt(0).nonzero().squeeze(1);
  EXPECT_EQ(p.tokens.index_select(0, pad).abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(p.probs.index_select(0, pad).abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(Close(F::moe_unpermute(p.tokens, p, probs), x * probs.sum(1, true)));
}

TEST(MoePermute, GradientsFlowThroughPermuteAndUnpermute) {
  const at::Tensor x = test::leaf(test::randn({4, 3}, 10));
  const at::Tensor map = at::tensor({1, 0, 1, 0, 1, 1, 0, 0, 1, 1, 1, 0}).view({4, 3});
  const at::Tensor probs = test::leaf(at::sigmoid(test::randn({4, 3}, 11)) * map);
  const F::Permutation p = F::moe_permute(x, map);
  const at::Tensor y = F::moe_unpermute(p.tokens * 3.0, p, probs);  // 3 x Σ_routed probs
  torch::autograd::backward({y.sum()});
  const at::Tensor weight = (probs.detach() * map).sum(1, true);
  EXPECT_TRUE(Close(y, 3 * x.detach() * weight));
  EXPECT_TRUE(Close(x.grad(), (3 * weight).expand({4, 3})));
  EXPECT_TRUE(Close(probs.grad(), 3 * x.detach().sum(1, true) * map));  // none where not routed
}

TEST(MoePermute, ChunksSortByIndex) {
  const at::Tensor x = at::arange(6).view({6, 1});
  const at::Tensor y = F::moe_sort_chunks_by_index(x, {1, 3, 2}, {2, 0, 1});
  EXPECT_TRUE(y.view({6}).equal(at::tensor({4, 5, 0, 1, 2, 3})));
}

TEST(Moe, BadInputIsNamed) {
  const at::Tensor logits = test::randn({4, 8}, 12);
  F::RouterOptions o;
  o.topk = 9;
  EXPECT_ERROR(F::topk_with_score_function(logits, o), "topk 9 is not in [1, 8]");
  o.topk = 2;
  o.num_groups = 3;
  EXPECT_ERROR(F::topk_with_score_function(logits, o), "must both be set");
  o.group_topk = 2;
  EXPECT_ERROR(F::topk_with_score_function(logits, o), "do not split into num_groups 3");
  o.num_groups = 4;
  o.group_topk = 5;
  EXPECT_ERROR(F::topk_with_score_function(logits, o), "group_topk 5 is more than num_groups 4");
  o.group_topk = 0;
  o.num_groups = 0;
  EXPECT_ERROR(F::topk_with_score_function(logits, o, at::zeros({8})),
               "expert_bias is used with score_function sigmoid");
  o.score_function = "sigmoid";
  EXPECT_ERROR(F::topk_with_score_function(logits, o, at::zeros({7})), "give floating-point [8]");
  EXPECT_ERROR(F::RouterOptions{}.score_function = "softplus", "score_function");
  EXPECT_ERROR(F::topk_with_score_function(at::ones({4, 8}, at::kLong), o), "floating-point");
  EXPECT_ERROR(F::moe_aux_loss(at::rand({4, 8}), at::ones({7}), 4, 2, 0.1), "give [8]");
  EXPECT_ERROR(F::moe_aux_loss(at::rand({4, 8}), at::ones({8}), 0, 2, 0.1), "total_tokens 0");
  EXPECT_ERROR(F::moe_z_loss(logits, 1.0, at::ones({3}, at::kBool)), "valid [3]");
  EXPECT_ERROR(F::moe_expert_capacity(8, 2, 4, 0.0), "capacity_factor 0");
  const at::Tensor x = at::rand({4, 3});
  EXPECT_ERROR(F::moe_permute(x, at::ones({5, 8}, at::kBool)), "[4, experts]");
  EXPECT_ERROR(F::moe_permute(x.view({2, 2, 3}), at::ones({4, 8}, at::kBool)), "[tokens, hidden]");
  EXPECT_ERROR(F::moe_permute(x, at::ones({4, 8}, at::kBool), 0), "align 0");
  EXPECT_ERROR(F::moe_permute_indices(x, at::tensor({0, 1, 8, 2}), 8), "(8) is outside [0, 8)");
  EXPECT_ERROR(F::moe_permute_indices(x, at::tensor({0, 1, 7, 2}), 8, 5), "num_out_tokens 5");
  EXPECT_ERROR(F::moe_permute_with_probs(x, at::rand({4, 7}), at::ones({4, 8}, at::kBool)),
               "shaped as routing_map [4, 8]");
  const F::Permutation p = F::moe_permute(x, at::ones({4, 2}, at::kBool));
  EXPECT_ERROR(F::moe_unpermute(p.tokens.narrow(0, 0, 7), p), "give [8, hidden]");
  EXPECT_ERROR(F::moe_unpermute(p.tokens, p, at::rand({4, 3})), "give [4, 2]");
  EXPECT_ERROR(F::moe_sort_chunks_by_index(x, {1, 2}, {1, 0}), "sum to 3 rows; x has 4");
  EXPECT_ERROR(F::moe_sort_chunks_by_index(x, {1, 3}, {1, 1}), "not a permutation");
}

// ---- GroupedLinear ---------------------------------------------------------------------------

// Each group's rows through its own kernel, one at a time (what GroupedLinear replaces).
at::Tensor per_group(const at::Tensor& x, const at::Tensor& kernel, const at::Tensor& bias,
                     const std::vector<int64_t>& splits) {
  std::vector<at::Tensor> parts;
  int64_t row = 0;
  for (size_t g = 0; g < splits.size(); ++g) {
    parts.push_back(at::matmul(x.narrow(0, row, splits[g]), kernel[g]) + bias[g]);
    row += splits[g];
  }
  return at::cat(parts, 0);
}

TEST(GroupedLinear, EachGroupThroughItsKernelWithGradients) {
  const std::vector<int64_t> splits = {3, 0, 5, 1};  // an expert that got no token
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    manual_seed(1);
    GroupedLinear experts(GroupedLinearOptions(4, 6, 5));
    experts->to(dtype);
    {
      torch::NoGradGuard no_grad;
      experts->bias.copy_(test::randn({4, 5}, 13));
    }
    const at::Tensor x0 = test::randn({9, 6}, 14).to(dtype), dy = test::randn({9, 5}, 15);
    const at::Tensor x = test::leaf(x0), xr = test::leaf(x0);
    const at::Tensor kr = test::leaf(experts->kernel), br = test::leaf(experts->bias);
    const at::Tensor y = experts->forward(x, splits);
    const at::Tensor want = per_group(xr, kr, br, splits);
    const double tol = dtype == at::kFloat ? 1e-6 : 1e-2;
    EXPECT_TRUE(Close(y.to(at::kFloat), want.to(at::kFloat), tol));
    torch::autograd::backward({y}, {dy.to(dtype)});
    torch::autograd::backward({want}, {dy.to(dtype)});
    EXPECT_TRUE(Close(x.grad().to(at::kFloat), xr.grad().to(at::kFloat), tol));
    EXPECT_TRUE(Close(experts->kernel.grad().to(at::kFloat), kr.grad().to(at::kFloat), tol));
    EXPECT_TRUE(Close(experts->bias.grad().to(at::kFloat), br.grad().to(at::kFloat), tol));
    EXPECT_EQ(experts->kernel.grad()[1].abs().sum().item<float>(), 0.0f);  // no rows, no grad
  }
}

TEST(GroupedLinear, WithoutBiasesTheKernelsAloneWithGradients) {
  const std::vector<int64_t> splits = {2, 4, 0};
  manual_seed(2);
  GroupedLinear experts(GroupedLinearOptions(3, 4, 5).use_bias(false));
  EXPECT_FALSE(experts->bias.defined());
  const at::Tensor x0 = test::randn({6, 4}, 3);
  const at::Tensor x = test::leaf(x0), xr = test::leaf(x0), kr = test::leaf(experts->kernel);
  const at::Tensor y = experts->forward(x, splits);
  const at::Tensor want =
      at::cat({at::matmul(xr.narrow(0, 0, 2), kr[0]), at::matmul(xr.narrow(0, 2, 4), kr[1])});
  EXPECT_TRUE(Close(y, want, 1e-6));
  y.sum().backward();
  want.sum().backward();
  EXPECT_TRUE(Close(x.grad(), xr.grad(), 1e-6));
  EXPECT_TRUE(Close(experts->kernel.grad(), kr.grad(), 1e-6));
}

// Under every recipe, each group's GEMM is a Dense GEMM with its own FP8 state: the grouped
// module equals one Dense per group (its kernel and bias copied) under the same recipe.
TEST(GroupedLinear, EveryFp8RecipeScalesEachGroupOnItsOwn) {
  const std::vector<int64_t> splits = {64, 32, 96};
  for (const fp8::Recipe& recipe : test::every_fp8_recipe()) {
    SCOPED_TRACE(fp8::to_string(recipe));
    manual_seed(2);
    GroupedLinear experts(GroupedLinearOptions(3, 128, 64));
    std::vector<Dense> dense;
    for (int64_t g = 0; g < 3; ++g) {
      dense.push_back(Dense(DenseOptions(128, 64)));
      torch::NoGradGuard no_grad;
      dense.back()->kernel.copy_(experts->kernel[g]);
    }
    // The groups differ in scale, so one shared scaling would be visibly off.
    const at::Tensor x0 =
        test::randn({192, 128}, 16) *
        at::repeat_interleave(at::tensor({1.0f, 30.0f, 0.01f}), at::tensor(splits)).unsqueeze(1);
    const at::Tensor x = test::leaf(x0);
    at::Tensor y, want;
    std::vector<at::Tensor> parts, inputs;
    {
      Fp8Autocast fp8(true, recipe);
      y = experts->forward(x, splits);
      y.sum().backward();
      int64_t row = 0;
      for (int64_t g = 0; g < 3; ++g) {
        inputs.push_back(test::leaf(x0.narrow(0, row, splits[g])));
        parts.push_back(dense[g](inputs.back()));
        parts.back().sum().backward();
        row += splits[g];
      }
      want = at::cat(parts, 0);
    }
    EXPECT_TRUE(y.equal(want));
    int64_t row = 0;
    for (int64_t g = 0; g < 3; ++g) {
      EXPECT_TRUE(x.grad().narrow(0, row, splits[g]).equal(inputs[g].grad())) << "group " << g;
      EXPECT_TRUE(experts->kernel.grad()[g].equal(dense[g]->kernel.grad())) << "group " << g;
      row += splits[g];
    }
  }
}

TEST(GroupedLinear, BadInputIsNamed) {
  GroupedLinear experts(GroupedLinearOptions(3, 4, 5));
  EXPECT_ERROR(experts->forward(at::rand({6, 4}), {1, 2}), "m_splits has 2 entries for 3 groups");
  EXPECT_ERROR(experts->forward(at::rand({6, 4}), {1, 2, 2}), "sum to 5 rows; the input has 6");
  EXPECT_ERROR(experts->forward(at::rand({6, 4}), {4, -1, 3}), "holds a negative count");
  EXPECT_ERROR(experts->forward(at::rand({6, 3}), {1, 2, 3}), "does not end in in_features 4");
  EXPECT_ERROR(experts->forward(at::rand({6, 4}).to(at::kDouble), {1, 2, 3}),
               "one dtype and device");
  EXPECT_ERROR(GroupedLinearImpl(GroupedLinearOptions(0, 4, 5)), "num_gemms (0)");
}

}  // namespace
}  // namespace te::nn
