// DelayedScaling / CurrentScaling arithmetic against hand-computed tables, recipe validation and
// the Fp8Autocast scope.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <thread>
#include <vector>

#include "../expect_error.h"
#include "te/fp8.h"
#include "te/sharding.h"

namespace te::fp8 {
namespace {

at::Tensor rows(std::vector<std::vector<float>> values) {
  std::vector<at::Tensor> out;
  for (auto& r : values) out.push_back(at::tensor(r));
  return at::stack(out);
}

TEST(Fp8Recipe, ComputeScaleFollowsTheFormulaAndKeepsTheOldScaleOtherwise) {
  EXPECT_EQ(compute_scale(448.0f, 7.0f, 448.0f, 0), 1.0f);
  EXPECT_EQ(compute_scale(2.0f, 7.0f, 448.0f, 0), 224.0f);
  EXPECT_EQ(compute_scale(2.0f, 7.0f, 448.0f, 1), 112.0f);  // margin: one power of two back
  EXPECT_EQ(compute_scale(2.0f, 7.0f, 57344.0f, 0), 28672.0f);
  EXPECT_EQ(compute_scale(3.0f, 7.0f, 448.0f, 0), 448.0f / 3.0f);
  // amax <= 0 or not finite: the old scale stays.
  EXPECT_EQ(compute_scale(0.0f, 7.0f, 448.0f, 0), 7.0f);
  EXPECT_EQ(compute_scale(-1.0f, 7.0f, 448.0f, 0), 7.0f);
  EXPECT_EQ(compute_scale(INFINITY, 7.0f, 448.0f, 0), 7.0f);
  EXPECT_EQ(compute_scale(std::nanf(""), 7.0f, 448.0f, 0), 7.0f);
  // A quotient that overflows fp32 would turn every value into inf: the old scale stays too.
  EXPECT_EQ(compute_scale(FLT_TRUE_MIN, 7.0f, 448.0f, 0), 7.0f);
}

// One update with the newest amaxes `newest` written into history[0] first.
void step(at::Tensor& h, at::Tensor& s, at::Tensor& si, std::vector<float> newest,
          const DelayedScaling& r, DType t = DType::kE4M3) {
  h[0].copy_(at::tensor(newest));
  update_scales(h, s, si, r, t);
}

TEST(Fp8Recipe, DelayedScalingMaxOverAWindowOfFour) {
  DelayedScaling r;
  r.amax_history_len = 4;
  at::Tensor h = at::zeros({4, 2}), s = at::ones({2}), si = at::ones({2});
  // Step 1: amaxes (2, 0): tensor 1 keeps its scale (amax 0). The history rolls by -1 and
  // row 0 is zeroed for the next step.
  step(h, s, si, {2, 0}, r);
  EXPECT_TRUE(at::equal(s, at::tensor({224.0f, 1.0f})));
  EXPECT_TRUE(at::equal(si, at::tensor({1.0f / 224.0f, 1.0f})));
  EXPECT_TRUE(at::equal(h, rows({{0, 0}, {0, 0}, {0, 0}, {2, 0}})));
  // Step 2: (1, 4): max over the window is (2, 4).
  step(h, s, si, {1, 4}, r);
  EXPECT_TRUE(at::equal(s, at::tensor({224.0f, 112.0f})));
  EXPECT_TRUE(at::equal(h, rows({{0, 0}, {0, 0}, {2, 0}, {1, 4}})));
  // Step 3: (0.5, 0): still (2, 4).
  step(h, s, si, {0.5f, 0}, r);
  EXPECT_TRUE(at::equal(s, at::tensor({224.0f, 112.0f})));
  EXPECT_TRUE(at::equal(h, rows({{0, 0}, {2, 0}, {1, 4}, {0.5f, 0}})));
  // Step 4: (0.25, 1): the window is [0.25 1; 2 0; 1 4; 0.5 0], max (2, 4). The roll pushes
  // step 1's 2 into row 0, which is zeroed: it leaves the window.
  step(h, s, si, {0.25f, 1}, r);
  EXPECT_TRUE(at::equal(s, at::tensor({224.0f, 112.0f})));
  EXPECT_TRUE(at::equal(h, rows({{0, 0}, {1, 4}, {0.5f, 0}, {0.25f, 1}})));
  // Step 5: (0.25, 1): max (1, 4).
  step(h, s, si, {0.25f, 1}, r);
  EXPECT_TRUE(at::equal(s, at::tensor({448.0f, 112.0f})));
  EXPECT_TRUE(at::equal(si, at::tensor({1.0f / 448.0f, 1.0f / 112.0f})));
}

TEST(Fp8Recipe, DelayedScalingMostRecentUsesOnlyTheNewestAmax) {
  DelayedScaling r;
  r.amax_history_len = 4;
  r.amax_compute_algo = "most_recent";
  at::Tensor h = at::zeros({4, 2}), s = at::ones({2}), si = at::ones({2});
  step(h, s, si, {2, 0}, r);
  EXPECT_TRUE(at::equal(s, at::tensor({224.0f, 1.0f})));
  step(h, s, si, {1, 4}, r);
  EXPECT_TRUE(at::equal(s, at::tensor({448.0f, 112.0f})));
  step(h, s, si, {0.5f, 0}, r);  // amax 0: tensor 1 keeps 112
  EXPECT_TRUE(at::equal(s, at::tensor({896.0f, 112.0f})));
  EXPECT_TRUE(at::equal(h, rows({{0, 0}, {2, 0}, {1, 4}, {0.5f, 0}})));
}

TEST(Fp8Recipe, DelayedScalingMarginE5M2AndNonFiniteAmax) {
  DelayedScaling r;
  r.amax_history_len = 2;
  r.margin = 2;
  at::Tensor h = at::zeros({2, 3}), s = at::full({3}, 5.0f), si = at::full({3}, 0.2f);
  step(h, s, si, {2, std::nanf(""), INFINITY}, r, DType::kE5M2);
  // 57344 / 2 / 2^2; the NaN and inf slots keep their scale (and scale_inv = 1 / scale).
  EXPECT_TRUE(at::equal(s, at::tensor({7168.0f, 5.0f, 5.0f})));
  EXPECT_EQ(si[0].item<float>(), 1.0f / 7168.0f);
  EXPECT_EQ(si[1].item<float>(), 1.0f / 5.0f);
  // History len 1: every step sees only its own amax.
  DelayedScaling one;
  one.amax_history_len = 1;
  at::Tensor h1 = at::zeros({1, 1}), s1 = at::ones({1}), si1 = at::ones({1});
  step(h1, s1, si1, {4}, one);
  EXPECT_EQ(s1.item<float>(), 112.0f);
  step(h1, s1, si1, {8}, one);
  EXPECT_EQ(s1.item<float>(), 56.0f);
  EXPECT_EQ(h1.item<float>(), 0.0f);
}

TEST(Fp8Recipe, UpdateMatchesComputeScaleOnRandomHistories) {
  DelayedScaling r;
  r.amax_history_len = 16;
  r.margin = 1;
  at::Tensor h = at::rand({16, 64}) * 100, s = at::ones({64}), si = at::ones({64});
  const at::Tensor before = h.clone();
  const at::Tensor old_scale = s.clone();
  update_scales(h, s, si, r, DType::kE4M3);
  const at::Tensor amax = std::get<0>(before.max(0));
  for (int64_t i = 0; i < 64; ++i) {
    EXPECT_EQ(s[i].item<float>(),
              compute_scale(amax[i].item<float>(), old_scale[i].item<float>(), 448.0f, 1));
  }
  EXPECT_TRUE(at::equal(h.narrow(0, 0, 15).narrow(0, 1, 14), before.narrow(0, 2, 14)));
  EXPECT_TRUE(at::equal(h[15], before[0]));
  EXPECT_TRUE(at::equal(h[0], at::zeros({64})));
}

TEST(Fp8Recipe, BadRecipesAreRefusedByName) {
  auto message = [](const auto& r) {
    try {
      const Recipe recipe(r);
    } catch (const te::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  DelayedScaling d;
  d.amax_history_len = 0;
  EXPECT_NE(message(d).find("amax_history_len is 0"), std::string::npos) << message(d);
  d = DelayedScaling{};
  d.margin = -1;
  EXPECT_NE(message(d).find("margin is -1"), std::string::npos) << message(d);
  d = DelayedScaling{};
  d.amax_compute_algo = "mean";
  EXPECT_NE(message(d).find("amax_compute_algo 'mean'"), std::string::npos) << message(d);
  EXPECT_ERROR(Fp8Autocast(true, d), "amax_compute_algo 'mean' is not 'max' or 'most_recent'");
  EXPECT_EQ(message(CurrentScaling{}), "");
  EXPECT_EQ(to_string(Recipe{DelayedScaling{}}),
            "DelayedScaling(margin=0, format=HYBRID, amax_history_len=1024, "
            "amax_compute_algo=max)");
  EXPECT_EQ(to_string(Recipe{CurrentScaling{Format::kE4M3}}), "CurrentScaling(format=E4M3)");
  EXPECT_EQ(backward_dtype(Format::kHybrid), DType::kE5M2);
  EXPECT_EQ(backward_dtype(Format::kE4M3), DType::kE4M3);
  EXPECT_EQ(forward_dtype(Format::kHybrid), DType::kE4M3);
}

TEST(Fp8Autocast, IsThreadLocalNestsAndOpensTheMeshResource) {
  EXPECT_FALSE(fp8_enabled());
  EXPECT_FALSE(fp8_recipe().has_value());
  {
    MeshResource resource;
    resource.dp = "data";
    resource.tp = "model";
    Fp8Autocast outer(true, CurrentScaling{}, resource);
    EXPECT_TRUE(fp8_enabled());
    EXPECT_TRUE(fp8_recipe()->is<CurrentScaling>());
    ASSERT_TRUE(current_mesh_resource().has_value());
    EXPECT_EQ(*current_mesh_resource()->tp, "model");
    // extend_logical_axis_rules works inside: the resource is in scope.
    const AxisRules extended = extend_logical_axis_rules(parse_axis_rules("vocab=model"));
    EXPECT_GT(extended.size(), 1u);
    {
      Fp8Autocast inner(false);
      EXPECT_FALSE(fp8_enabled());
      bool other_thread = true;
      std::thread([&] { other_thread = fp8_enabled(); }).join();
      EXPECT_FALSE(other_thread);
    }
    EXPECT_TRUE(fp8_enabled());
  }
  EXPECT_FALSE(fp8_enabled());
  EXPECT_FALSE(current_mesh_resource().has_value());
  // Outside, TE's advice.
  EXPECT_ERROR(extend_logical_axis_rules(parse_axis_rules("vocab=model")),
               "needs a MeshResource in scope");
}

}  // namespace
}  // namespace te::fp8
