// te::nn modules under Fp8Autocast on one process: error bounds against fp32, the FP8 state as
// buffers (recorded, updated, saved, loaded, cloned), the kernel cache, and training.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/optim/adam.h>
#include <torch/serialize.h>

#include <atomic>
#include <cmath>
#include <sstream>
#include <thread>

#include "te/fp8.h"
#include "te/nn.h"

namespace te::nn {
namespace {

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randn(shape, g);
}

// What rounding to E4M3 can cost one value v cast with scale s: RNE keeps 3 mantissa bits, so a
// normal value (|v s| >= 2^-6) moves by at most half an ulp, 2^-4 |v|; a subnormal one by at
// most half the smallest subnormal, 2^-10 / s. (No value here saturates: amax s <= 448.)
at::Tensor e4m3_error(const at::Tensor& v, float s) {
  return v.abs() * 0.0625 + std::ldexp(1.0, -10) / s;
}

TEST(Fp8Modules, DenseForwardIsWithinTheE4M3BoundOfFp32) {
  manual_seed(1);
  Dense dense(DenseOptions(64, 32).use_bias(true));
  const at::Tensor x = randn({4, 8, 64}, 2) * 3;
  const at::Tensor ref = dense(x).detach();
  at::Tensor y;
  {
    Fp8Autocast fp8(true, fp8::DelayedScaling{});
    y = dense(x).detach();
    // The amaxes of this step sit in history row 0 until the region ends.
    EXPECT_EQ(dense->fp8_meta->fwd_amax_history[0][0].item<float>(), x.abs().max().item<float>());
    EXPECT_EQ(dense->fp8_meta->fwd_amax_history[0][1].item<float>(),
              dense->kernel.abs().max().item<float>());
  }
  // Scale 1 (the initial one) for both operands. With ex, ew the per-value bounds above,
  // |x8 w8 - x w| <= ex |w| + |x| ew + ex ew per product; summed over K, plus fp32 rounding.
  const at::Tensor ex = e4m3_error(x, 1.0f), ew = e4m3_error(dense->kernel.detach(), 1.0f);
  const at::Tensor ax = x.abs(), aw = dense->kernel.detach().abs();
  const at::Tensor bound =
      at::matmul(ex, aw) + at::matmul(ax, ew) + at::matmul(ex, ew) + 1e-5 * at::matmul(ax, aw);
  EXPECT_TRUE(((y - ref).abs() <= bound).all().item<bool>())
      << "worst excess " << ((y - ref).abs() - bound).max().item<double>();
  EXPECT_FALSE(at::equal(y, ref));  // it did run in FP8
  // After the region: scales from the recorded amaxes, the history rolled.
  const auto& m = *dense->fp8_meta;
  EXPECT_EQ(m.fwd_scale[0].item<float>(), 448.0f / x.abs().max().item<float>());
  EXPECT_EQ(m.fwd_amax_history[1023][0].item<float>(), x.abs().max().item<float>());
  EXPECT_EQ(m.fwd_amax_history[0][0].item<float>(), 0.0f);
}

TEST(Fp8Modules, LayerNormMlpForwardIsCloseToFp32) {
  manual_seed(3);
  LayerNormMLP mlp(LayerNormMLPOptions(64, 256).activations({"gelu"}).intermediate_dropout_rate(0));
  const at::Tensor x = randn({4, 16, 64}, 4);
  const at::Tensor ref = mlp(x).detach();
  // Calibrate the delayed scales with one step, then measure with them.
  fp8::DelayedScaling recipe;
  recipe.amax_history_len = 16;
  {
    Fp8Autocast fp8(true, recipe);
    mlp(x);
  }
  at::Tensor y;
  {
    Fp8Autocast fp8(true, recipe);
    y = mlp(x).detach();
  }
  // Each operand carries a relative rounding error of at most 2^-4 (3 mantissa bits), about
  // 2^-4 / sqrt(3) ~ 3.6% RMS; a GEMM's output sums K such errors of both operands with random
  // signs, so its relative RMS error is about sqrt(2) * 3.6% ~ 5% of the typical product and
  // no more than that of the output. Two GEMMs (gelu between) compound to ~7%: allow 10%.
  const double rel = ((y - ref).norm() / ref.norm()).item<double>();
  EXPECT_LT(rel, 0.10);
  EXPECT_GT(rel, 1e-4);  // FP8 did run
  RecordProperty("relative_error", std::to_string(rel));
  std::cout << "LayerNormMLP FP8 vs fp32 relative error " << rel << "\n";
  // The two GEMMs have their own state; the history took the recipe's length.
  EXPECT_EQ(mlp->wi_fp8->fwd_amax_history.size(0), 16);
  EXPECT_NE(mlp->wi_fp8->fwd_scale[0].item<float>(), mlp->wo_fp8->fwd_scale[0].item<float>());
}

TEST(Fp8Modules, AttentionProjectionsAndTheTransformerLayerRunInFp8) {
  manual_seed(30);
  TransformerLayer layer([&] {
    auto made = TransformerLayerOptions(64, 128, 4).hidden_dropout(0).intermediate_dropout(0);
    made.self_attention().attention().attention_dropout(0);
    return made;
  }());
  // Training mode (no dropout to draw): only training records amaxes and moves the scales.
  layer->train();
  const at::Tensor x = randn({2, 8, 64}, 31).requires_grad_(true);
  const at::Tensor ref = layer(x).detach();
  fp8::DelayedScaling recipe;
  recipe.amax_history_len = 4;
  {
    Fp8Autocast fp8(true, recipe);
    layer(x);
  }  // calibrate
  at::Tensor y;
  {
    Fp8Autocast fp8(true, recipe);
    y = layer(x);
    y.sum().backward();
  }
  // Four GEMMs in the attention block and two in the MLP, each ~5% RMS (see above); the
  // residual path is exact, so the block output stays well within 10%.
  const double rel = ((y.detach() - ref).norm() / ref.norm()).item<double>();
  EXPECT_LT(rel, 0.10);
  EXPECT_GT(rel, 1e-5);
  EXPECT_TRUE(x.grad().defined());
  auto& attention = *layer->self_attention;
  for (const auto* m : {attention.qkv_fp8.get(), attention.out_fp8.get()}) {
    ASSERT_NE(m, nullptr);
    EXPECT_NE(m->fwd_scale[0].item<float>(), 1.0f);  // calibrated from recorded amaxes
    EXPECT_NE(m->bwd_scale[0].item<float>(), 1.0f);  // backward ran in FP8 and updated it
  }
  EXPECT_EQ(attention.q_fp8, nullptr);  // fused QKV: no separate Q projection
}

TEST(Fp8Modules, LayerNormDenseRunsItsGemmInFp8) {
  manual_seed(32);
  LayerNormDense ln_dense(32, 16);
  const at::Tensor x = randn({4, 32}, 33);
  const at::Tensor ref = ln_dense(x).detach();
  at::Tensor y;
  {
    Fp8Autocast fp8(true, fp8::DelayedScaling{});
    y = ln_dense(x).detach();
    // The input amax is the normalised input's (what the GEMM casts), not x's.
    const at::Tensor normed = ln_dense->layernorm(x).detach();
    EXPECT_EQ(ln_dense->dense->fp8_meta->fwd_amax_history[0][0].item<float>(),
              normed.abs().max().item<float>());
  }
  EXPECT_FALSE(at::equal(y, ref));
  EXPECT_LT(((y - ref).norm() / ref.norm()).item<double>(), 0.10);
}

TEST(Fp8Modules, BackwardRunsInE5M2AndUpdatesTheGradientScaleWhenItEnds) {
  manual_seed(5);
  Dense dense(32, 16);
  const at::Tensor x = randn({8, 32}, 6).requires_grad_(true);
  const at::Tensor g = randn({8, 16}, 7) * 1e-3;
  {
    Fp8Autocast fp8(true, fp8::DelayedScaling{});
    at::Tensor y = dense(x);
    y.backward(g);
  }
  const auto& m = *dense->fp8_meta;
  // The gradient's amax went through the history and became an E5M2 scale.
  EXPECT_EQ(m.bwd_amax_history[1023][0].item<float>(), g.abs().max().item<float>());
  EXPECT_EQ(m.bwd_scale[0].item<float>(), 57344.0f / g.abs().max().item<float>());
  // dgrad = g8 @ w8^T, with g cast to E5M2 at scale 1 (so 1e-3-sized values are coarse).
  const at::Tensor w8 =
      fp8::quantize(dense->kernel.detach(), at::ones({1}), fp8::DType::kE4M3).dequantize();
  const at::Tensor g8 = fp8::quantize(g, at::ones({1}), fp8::DType::kE5M2).dequantize();
  EXPECT_TRUE(at::allclose(x.grad(), at::mm(g8, w8.t()), 1e-5, 1e-7));
  const at::Tensor x8 = fp8::quantize(x.detach(), at::ones({1}), fp8::DType::kE4M3).dequantize();
  EXPECT_TRUE(at::allclose(dense->kernel.grad(), at::mm(x8.t(), g8), 1e-5, 1e-7));
}

TEST(Fp8Modules, TheStateIsBuffersThatSaveLoadAndClone) {
  manual_seed(8);
  Dense dense(16, 16);
  {
    Fp8Autocast fp8(true, fp8::DelayedScaling{});
    dense(randn({4, 16}, 9) * 7).sum().backward();
  }
  std::vector<std::string> names;
  for (const auto& b : dense->named_buffers()) names.push_back(b.key());
  EXPECT_EQ(names, (std::vector<std::string>{"fp8_fwd_scale", "fp8_fwd_scale_inv",
                                             "fp8_fwd_amax_history", "fp8_bwd_scale",
                                             "fp8_bwd_scale_inv", "fp8_bwd_amax_history"}));
  // Save and load into a fresh module.
  std::stringstream stream;
  {
    torch::serialize::OutputArchive out;
    dense->save(out);
    out.save_to(stream);
  }
  manual_seed(99);
  Dense loaded(16, 16);
  {
    torch::serialize::InputArchive in;
    in.load_from(stream);
    loaded->load(in);
  }
  EXPECT_TRUE(at::equal(loaded->fp8_meta->fwd_scale, dense->fp8_meta->fwd_scale));
  EXPECT_TRUE(at::equal(loaded->fp8_meta->bwd_amax_history, dense->fp8_meta->bwd_amax_history));
  EXPECT_NE(loaded->fp8_meta->fwd_scale[0].item<float>(), 1.0f);
  // A clone has its own copy.
  auto copy = std::dynamic_pointer_cast<DenseImpl>(dense->clone());
  EXPECT_TRUE(at::equal(copy->fp8_meta->fwd_scale, dense->fp8_meta->fwd_scale));
  copy->fp8_meta->fwd_scale.fill_(3.0f);
  EXPECT_NE(dense->fp8_meta->fwd_scale[0].item<float>(), 3.0f);
  EXPECT_EQ(copy->named_buffers()["fp8_fwd_scale"][0].item<float>(), 3.0f);
}

TEST(Fp8Modules, KernelCodesAreCachedWhileKernelAndScaleAreUnchanged) {
  manual_seed(10);
  Dense dense(16, 8);
  torch::optim::Adam opt(dense->parameters(), 1e-2);
  const at::Tensor x = randn({4, 16}, 11);
  fp8::DelayedScaling recipe;
  {
    Fp8Autocast fp8(true, recipe);
    const at::Tensor y1 = dense(x), y2 = dense(x);  // two micro-steps
    EXPECT_EQ(dense->fp8_meta->kernel_cache_hits, 1);
    EXPECT_TRUE(at::equal(y1, y2));
    (y1.sum() + y2.sum()).backward();
  }
  // The scales were updated at the region's end: cast again. (Whether the value changed is not
  // asked: that would read it back from the device inside the step.)
  {
    Fp8Autocast fp8(true, recipe);
    dense(x);
  }
  EXPECT_EQ(dense->fp8_meta->kernel_cache_hits, 1);
  // Inference records nothing and updates nothing: after the cast the last update asks for,
  // every call reuses the codes, across regions too.
  dense->eval();
  {
    Fp8Autocast fp8(true, recipe);
    dense(x);
    dense(x);
  }
  {
    Fp8Autocast fp8(true, recipe);
    dense(x);
  }
  EXPECT_EQ(dense->fp8_meta->kernel_cache_hits, 3);
  dense->train();
  opt.step();  // the kernel changes in place
  {
    Fp8Autocast fp8(true, recipe);
    dense(x);
    dense(x);
  }
  EXPECT_EQ(dense->fp8_meta->kernel_cache_hits, 4) << "cast once after the step, then reused";
}

TEST(Fp8Modules, OutsideAnEnabledRegionModulesRunFp32AndLinearRefuses) {
  manual_seed(12);
  Dense dense(8, 8);
  const at::Tensor x = randn({2, 8}, 13);
  const at::Tensor ref = at::matmul(x, dense->kernel);
  EXPECT_TRUE(at::allclose(dense(x), ref));
  {
    Fp8Autocast off(false);
    EXPECT_TRUE(at::allclose(dense(x), ref));
  }
  EXPECT_EQ(dense->fp8_meta->fwd_amax_history.abs().sum().item<float>(), 0.0f);
  try {
    fp8::linear(x, dense->kernel, dense->fp8_meta);
    FAIL() << "fp8::linear ran outside Fp8Autocast";
  } catch (const te::Error& e) {
    EXPECT_NE(std::string(e.what()).find("inside an enabled te::Fp8Autocast"), std::string::npos);
  }
}

TEST(Fp8Modules, ThreadsSharingAModuleEachRunTheirOwnRegion) {
  manual_seed(14);
  Dense dense(32, 16);
  const at::Tensor x = randn({8, 32}, 15);
  fp8::DelayedScaling recipe;
  recipe.amax_history_len = 8;
  at::Tensor want;
  for (int i = 0; i < 2; ++i) {  // the second step runs with the calibrated (now stable) scales
    Fp8Autocast fp8(true, recipe);
    want = dense(x).detach();
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        Fp8Autocast fp8(true, recipe);  // thread-local: each thread its own region
        if (!at::equal(dense(x), want)) ++mismatches;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_FALSE(fp8_enabled());
}

// A two-layer regressor on a noisy teacher (label noise 0.09): fp32 goes from ~1.2 to a ~0.32
// plateau within 300 Adam steps; FP8 must end on the same plateau.
struct Losses {
  double first = 0, last = 0;  // the first step's, and the mean over the last 50 steps
};

Losses train(bool use_fp8, const fp8::Recipe& recipe) {
  manual_seed(20);
  LayerNormMLP mlp(LayerNormMLPOptions(16, 64).activations({"gelu"}).intermediate_dropout_rate(0));
  Dense head(DenseOptions(16, 4).use_bias(true));
  std::vector<at::Tensor> params = mlp->parameters();
  for (const auto& p : head->parameters()) params.push_back(p);
  torch::optim::Adam opt(params, 1e-2);
  const at::Tensor teacher = randn({16, 4}, 21);
  Losses losses;
  constexpr int kSteps = 300, kTail = 50;
  for (int step = 0; step < kSteps; ++step) {
    const at::Tensor x = randn({32, 16}, 1000 + step);
    const at::Tensor target = at::tanh(at::matmul(x, teacher)) + 0.3 * randn({32, 4}, 5000 + step);
    opt.zero_grad();
    at::Tensor loss;
    {
      Fp8Autocast fp8(use_fp8, recipe);
      loss = (head(mlp(x)) - target).pow(2).mean();
      loss.backward();
    }
    opt.step();
    if (step == 0) losses.first = loss.item<double>();
    if (step >= kSteps - kTail) losses.last += loss.item<double>() / kTail;
  }
  return losses;
}

TEST(Fp8Modules, AnMlpTrainsUnderFp8ToWithinFivePercentOfFp32) {
  fp8::DelayedScaling delayed;
  delayed.amax_history_len = 16;
  const Losses fp32_run = train(false, delayed);
  const double fp32 = fp32_run.last;
  const double delayed_loss = train(true, delayed).last;
  const double current_loss = train(true, fp8::CurrentScaling{}).last;
  std::cout << "loss: first step (fp32) " << fp32_run.first << "; last 50 steps: fp32 " << fp32
            << ", FP8 delayed " << delayed_loss << ", FP8 current " << current_loss << "\n";
  EXPECT_LT(fp32, 0.5 * fp32_run.first);  // it learned
  EXPECT_LE(std::abs(delayed_loss - fp32), 0.05 * fp32);
  EXPECT_LE(std::abs(current_loss - fp32), 0.05 * fp32);
}

}  // namespace
}  // namespace te::nn
