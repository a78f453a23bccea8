// te::nn modules on one process: each equals a reference written with plain LibTorch ops on the
// same weights (forward and every gradient), and behaves as a LibTorch module should.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/serialize.h>

#include <sstream>

#include "../expect_error.h"
#include "nn_test_util.h"
#include "te/nn.h"

namespace te::nn {
namespace {

using test::Close;
using test::leaf;
using test::randn;

at::Tensor input(std::vector<int64_t> shape, uint64_t seed) {
  return randn(std::move(shape), seed).requires_grad_(true);
}

std::string printed(const torch::nn::Module& m) {
  std::ostringstream os;
  m.pretty_print(os);
  return os.str();
}

// ---- Dense -------------------------------------------------------------------------------------

TEST(Dense, EqualsMatmulPlusBiasWithAllGradients) {
  manual_seed(1);
  Dense dense(DenseOptions(16, 8));
  at::Tensor x = input({2, 3, 16}, 2);
  at::Tensor y = dense(x);
  at::Tensor xr = leaf(x), w = leaf(dense->kernel), b = leaf(dense->bias);
  at::Tensor yr = at::matmul(xr, w) + b;
  EXPECT_TRUE(Close(y, yr));
  at::Tensor g = at::randn_like(y);
  torch::autograd::backward({y}, {g});
  torch::autograd::backward({yr}, {g});
  EXPECT_TRUE(Close(x.grad(), xr.grad()));
  EXPECT_TRUE(Close(dense->kernel.grad(), w.grad()));
  EXPECT_TRUE(Close(dense->bias.grad(), b.grad()));
}

TEST(Dense, InitialisesWithTruncatedNormalFanIn) {
  manual_seed(3);
  Dense dense(DenseOptions(512, 256));
  const double std = dense->kernel.std().item<double>();
  EXPECT_NEAR(std, 1.0 / std::sqrt(512.0), 0.05 / std::sqrt(512.0));
  EXPECT_LE(dense->kernel.abs().max().item<double>(), 2.0 / 0.8796 / std::sqrt(512.0) + 1e-6);
  EXPECT_TRUE(at::equal(dense->bias, at::zeros({256})));
  // The same seed gives the same weights, on any thread.
  manual_seed(3);
  Dense again(DenseOptions(512, 256));
  EXPECT_TRUE(at::equal(dense->kernel, again->kernel));
}

TEST(Dense, IdiomsOfLibTorch) {
  manual_seed(4);
  Dense dense(DenseOptions(4, 3).kernel_axes({"w_fsdp", "w_tp"}));
  EXPECT_EQ(printed(*dense),
            "te::nn::Dense(in_features=4, out_features=3, bias=true, kernel_axes=('w_fsdp', "
            "'w_tp'))");
  std::vector<std::string> names;
  for (const auto& p : dense->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"kernel", "bias"}));
  const auto axes = named_parameter_axes(*dense);
  EXPECT_EQ(to_string(axes.at("kernel")), "('w_fsdp', 'w_tp')");
  EXPECT_EQ(to_string(axes.at("bias")), "(None)");

  auto copy = std::dynamic_pointer_cast<DenseImpl>(dense->clone());
  ASSERT_TRUE(copy);
  EXPECT_TRUE(at::equal(copy->kernel, dense->kernel));
  copy->kernel.data().add_(1.0);
  EXPECT_FALSE(at::equal(copy->kernel, dense->kernel));  // a deep copy

  at::Tensor x = at::randn({2, 4});
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(dense(x).requires_grad());
  }
  {
    c10::InferenceMode inference;
    EXPECT_TRUE(Close(dense(x), at::matmul(x, dense->kernel) + dense->bias));
  }
  dense->to(at::kDouble);
  EXPECT_EQ(dense->kernel.scalar_type(), at::kDouble);
  EXPECT_EQ(dense(x.to(at::kDouble)).scalar_type(), at::kDouble);
}

TEST(Dense, SaveAndLoadRoundTrip) {
  manual_seed(5);
  Dense dense(DenseOptions(6, 5));
  std::stringstream stream;
  torch::save(dense, stream);
  manual_seed(6);
  Dense loaded(DenseOptions(6, 5));
  EXPECT_FALSE(at::equal(loaded->kernel, dense->kernel));
  torch::load(loaded, stream);
  EXPECT_TRUE(at::equal(loaded->kernel, dense->kernel));
  EXPECT_TRUE(at::equal(loaded->bias, dense->bias));
}

TEST(Dense, ReportsBadInput) {
  EXPECT_ERROR(Dense(DenseOptions(0, 3)), "in_features (0) and out_features (3) must be positive");
  EXPECT_ERROR(Dense(DenseOptions(4, 3).kernel_axes({"w_fsdp"})),
               "parameter 'kernel' has 2 dims but 1 logical axes ('w_fsdp')");  // 1 axis, 2 dims
  EXPECT_ERROR(Dense(DenseOptions(4, 3).kernel_axes({"w_tp", "w_tp"})),
               "logical axis 'w_tp' occurs more than once");  // repeated
  Dense dense(DenseOptions(4, 3));
  try {
    dense(at::randn({2, 5}));
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not contract"), std::string::npos) << e.what();
  }
}

// ---- LayerNorm ---------------------------------------------------------------------------------

TEST(LayerNorm, EqualsAtLayerNormWithAllGradients) {
  LayerNorm ln(LayerNormOptions(8));
  ln->scale.data().copy_(at::rand({8}) + 0.5);
  ln->ln_bias.data().copy_(at::randn({8}));
  at::Tensor x = input({3, 5, 8}, 7);
  at::Tensor y = ln(x);
  at::Tensor xr = leaf(x), g = leaf(ln->scale), b = leaf(ln->ln_bias);
  at::Tensor yr = at::layer_norm(xr, {8}, g, b, 1e-6);
  EXPECT_TRUE(Close(y, yr));
  at::Tensor dy = at::randn_like(y);
  torch::autograd::backward({y}, {dy});
  torch::autograd::backward({yr}, {dy});
  EXPECT_TRUE(Close(x.grad(), xr.grad(), 1e-5));
  EXPECT_TRUE(Close(ln->scale.grad(), g.grad()));
  EXPECT_TRUE(Close(ln->ln_bias.grad(), b.grad()));
  EXPECT_EQ(printed(*ln),
            "te::nn::LayerNorm(hidden_size=8, type=layernorm, epsilon=1e-06, "
            "zero_centered_gamma=false)");
}

TEST(LayerNorm, RmsNormAndZeroCenteredGamma) {
  LayerNorm rms(LayerNormOptions(8).layernorm_type("rmsnorm").zero_centered_gamma(true));
  EXPECT_FALSE(rms->ln_bias.defined());
  EXPECT_TRUE(at::equal(rms->scale, at::zeros({8})));  // gamma - 1
  rms->scale.data().copy_(at::randn({8}));
  at::Tensor x = input({4, 8}, 8);
  at::Tensor xr = leaf(x), g = leaf(rms->scale);
  at::Tensor yr = xr / at::sqrt((xr * xr).mean({-1}, true) + 1e-6) * (1 + g);
  at::Tensor y = rms(x);
  EXPECT_TRUE(Close(y, yr));
  at::Tensor dy = at::randn_like(y);
  torch::autograd::backward({y}, {dy});
  torch::autograd::backward({yr}, {dy});
  EXPECT_TRUE(Close(x.grad(), xr.grad(), 1e-5));
  EXPECT_TRUE(Close(rms->scale.grad(), g.grad()));
  EXPECT_ERROR(LayerNorm(LayerNormOptions(8).layernorm_type("batchnorm")),
               "layernorm_type 'batchnorm' is not 'layernorm' or 'rmsnorm'");
}

// ---- LayerNormDense ----------------------------------------------------------------------------

TEST(LayerNormDense, EqualsNormThenMatmul) {
  manual_seed(9);
  LayerNormDense lnd(LayerNormDenseOptions(8, 6).return_layernorm_output(true));
  at::Tensor x = input({2, 3, 8}, 10);
  auto [y, ln_out] = lnd->forward_with_layernorm_output(x);
  ASSERT_TRUE(ln_out.has_value());
  at::Tensor xr = leaf(x), w = leaf(lnd->dense->kernel), b = leaf(lnd->dense->bias);
  at::Tensor g = leaf(lnd->layernorm->scale), beta = leaf(lnd->layernorm->ln_bias);
  at::Tensor lnr = at::layer_norm(xr, {8}, g, beta, 1e-6);
  at::Tensor yr = at::matmul(lnr, w) + b;
  EXPECT_TRUE(Close(*ln_out, lnr));
  EXPECT_TRUE(Close(y, yr));
  at::Tensor dy = at::randn_like(y);
  torch::autograd::backward({y}, {dy});
  torch::autograd::backward({yr}, {dy});
  EXPECT_TRUE(Close(x.grad(), xr.grad(), 1e-5));
  EXPECT_TRUE(Close(lnd->dense->kernel.grad(), w.grad()));
  EXPECT_TRUE(Close(lnd->layernorm->scale.grad(), g.grad()));
  std::vector<std::string> names;
  for (const auto& p : lnd->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"layernorm.scale", "layernorm.ln_bias", "dense.kernel",
                                             "dense.bias"}));
  EXPECT_FALSE(LayerNormDense(LayerNormDenseOptions(8, 6))
                   ->forward_with_layernorm_output(x)
                   .second.has_value());
}

// ---- LayerNormMLP ------------------------------------------------------------------------------

at::Tensor reference_activation(const at::Tensor& x, const std::string& name) {
  if (name == "gelu") return at::gelu(x, "tanh");
  if (name == "relu") return at::relu(x);
  if (name == "silu") return x * at::sigmoid(x);
  return x;  // linear
}

class LayerNormMLPActivations : public ::testing::TestWithParam<std::vector<std::string>> {};

TEST_P(LayerNormMLPActivations, EqualsTheComposition) {
  const auto& acts = GetParam();
  manual_seed(11);
  LayerNormMLP mlp(LayerNormMLPOptions(8, 12).activations(acts).use_bias(true));
  mlp->eval();  // no dropout
  mlp->wi_bias.data().copy_(at::randn_like(mlp->wi_bias));
  mlp->wo_bias.data().copy_(at::randn_like(mlp->wo_bias));
  at::Tensor x = input({2, 3, 8}, 12);
  at::Tensor y = mlp(x);

  at::Tensor xr = leaf(x), g = leaf(mlp->layernorm->scale), beta = leaf(mlp->layernorm->ln_bias);
  at::Tensor w1 = leaf(mlp->wi_kernel), b1 = leaf(mlp->wi_bias);
  at::Tensor w2 = leaf(mlp->wo_kernel), b2 = leaf(mlp->wo_bias);
  at::Tensor h = at::einsum("bsh,haf->bsaf", {at::layer_norm(xr, {8}, g, beta, 1e-6), w1}) + b1;
  at::Tensor act = reference_activation(h.select(-2, 0), acts[0]);
  for (std::size_t i = 1; i < acts.size(); ++i) {
    act = act * reference_activation(h.select(-2, static_cast<int64_t>(i)), acts[i]);
  }
  at::Tensor yr = at::matmul(act, w2) + b2;
  EXPECT_TRUE(Close(y, yr));
  at::Tensor dy = at::randn_like(y);
  torch::autograd::backward({y}, {dy});
  torch::autograd::backward({yr}, {dy});
  EXPECT_TRUE(Close(x.grad(), xr.grad(), 1e-5));
  EXPECT_TRUE(Close(mlp->wi_kernel.grad(), w1.grad()));
  EXPECT_TRUE(Close(mlp->wi_bias.grad(), b1.grad()));
  EXPECT_TRUE(Close(mlp->wo_kernel.grad(), w2.grad()));
  EXPECT_TRUE(Close(mlp->wo_bias.grad(), b2.grad()));
  EXPECT_TRUE(Close(mlp->layernorm->scale.grad(), g.grad()));
  EXPECT_TRUE(Close(mlp->layernorm->ln_bias.grad(), beta.grad()));
}

INSTANTIATE_TEST_SUITE_P(Activations, LayerNormMLPActivations,
                         ::testing::Values(std::vector<std::string>{"gelu"},
                                           std::vector<std::string>{"relu"},
                                           std::vector<std::string>{"gelu", "linear"},
                                           std::vector<std::string>{"silu", "linear"}),
                         [](const auto& info) {
                           std::string name;
                           for (const auto& a : info.param) name += (name.empty() ? "" : "_") + a;
                           return name;
                         });

TEST(LayerNormMLP, DropoutOnlyInTraining) {
  manual_seed(13);
  LayerNormMLP mlp(LayerNormMLPOptions(8, 16).intermediate_dropout_rate(0.5));
  at::Tensor x = at::randn({4, 8});
  mlp->eval();
  EXPECT_TRUE(at::equal(mlp(x), mlp(x)));
  mlp->train();
  EXPECT_FALSE(at::equal(mlp(x), mlp(x)));
  EXPECT_EQ(printed(*mlp),
            "te::nn::LayerNormMLP(hidden_size=8, ffn_hidden_size=16, activations=(relu), "
            "dropout=0.5, bias=false)");
  const auto axes = named_parameter_axes(*mlp);
  EXPECT_EQ(to_string(axes.at("wi_kernel")), "('w_fsdp', 'w_joined', 'w_tp')");
  EXPECT_EQ(to_string(axes.at("wo_kernel")), "('w_tp', 'w_fsdp')");
  EXPECT_EQ(to_string(axes.at("layernorm.scale")), "('w_no_shard')");
}

TEST(LayerNormMLP, ReportsBadOptions) {
  EXPECT_ERROR(LayerNormMLP(LayerNormMLPOptions(8, 16).activations({"swish"})),
               "activation 'swish' is not one of");
  EXPECT_ERROR(LayerNormMLP(LayerNormMLPOptions(8, 16).activations({})), "activations is empty");
  EXPECT_ERROR(LayerNormMLP(LayerNormMLPOptions(8, 16).intermediate_dropout_rate(1.0)),
               "intermediate_dropout_rate 1 is not in [0, 1)");
  EXPECT_ERROR(LayerNormMLP(LayerNormMLPOptions(8, 16).kernel_axes_2({"w_tp"})),
               "parameter 'wo_kernel' has 2 dims but 1 logical axes ('w_tp')");
}

}  // namespace
}  // namespace te::nn

namespace te::nn {
namespace {

// Every module in bf16 and fp16 (module->to(dtype), input in dtype) against the same module in
// fp32: outputs and input gradients within a bound from the format's precision. Each op rounds
// its output to p significant bits (bf16: 8, fp16: 11), a relative error of at most 2^-p; the
// modules chain at most ~8 rounding steps (norm, projections, softmax, activation, residual add),
// so 8 * 2^-p of the output's magnitude bounds the difference: 2^-5 for bf16, 2^-8 for fp16.
// Normalisation statistics and softmax run in fp32 inside, as TE does.
TEST(ReducedPrecision, EveryModuleInBf16AndFp16IsWithinItsBoundOfFp32) {
  struct Made {
    std::shared_ptr<torch::nn::Module> module;
    std::function<at::Tensor(const at::Tensor&)> forward;
  };
  const at::Tensor mask = at::arange(6)
                              .view({1, 1, 1, 6})
                              .ge(at::tensor(std::vector<int64_t>{6, 4, 5}).view({-1, 1, 1, 1}));
  auto make = [&](int kind) -> Made {
    manual_seed(40);
    switch (kind) {
      case 0: {
        Dense m(DenseOptions(32, 24));
        return {m.ptr(), [m](const at::Tensor& x) mutable { return m(x); }};
      }
      case 1: {
        LayerNorm m(LayerNormOptions(32));
        return {m.ptr(), [m](const at::Tensor& x) mutable { return m(x); }};
      }
      case 2: {
        LayerNormMLP m(LayerNormMLPOptions(32, 48).activations({"gelu", "linear"}));
        m->eval();
        return {m.ptr(), [m](const at::Tensor& x) mutable { return m(x); }};
      }
      case 3: {
        MultiHeadAttention m([&] {
          auto made = MultiHeadAttentionOptions(32, 4);
          made.attention().attn_mask_type("padding");
          return made;
        }());
        return {m.ptr(), [m, mask](const at::Tensor& x) mutable { return m(x, {}, mask); }};
      }
      default: {
        TransformerLayer m([&] {
          auto made = TransformerLayerOptions(32, 48, 4);
          made.self_attention().attention().attn_mask_type("padding");
          return made;
        }());
        m->eval();
        return {m.ptr(), [m, mask](const at::Tensor& x) mutable { return m(x, mask); }};
      }
    }
  };
  const char* names[] = {"Dense", "LayerNorm", "LayerNormMLP", "MultiHeadAttention",
                         "TransformerLayer"};
  const at::Tensor x32 = test::randn({3, 6, 32}, 41);
  for (int kind = 0; kind < 5; ++kind) {
    Made ref = make(kind);
    at::Tensor xr = x32.clone().requires_grad_(true);
    at::Tensor yr = ref.forward(xr);
    yr.backward(at::ones_like(yr));
    for (const auto& [dtype, bound] : {std::pair<at::ScalarType, double>{at::kBFloat16, 1.0 / 32},
                                       std::pair<at::ScalarType, double>{at::kHalf, 1.0 / 256}}) {
      Made m = make(kind);
      m.module->to(dtype);
      at::Tensor x = x32.to(dtype).requires_grad_(true);
      at::Tensor y = m.forward(x);
      EXPECT_EQ(y.scalar_type(), dtype) << names[kind];
      y.backward(at::ones_like(y));
      EXPECT_EQ(x.grad().scalar_type(), dtype) << names[kind];
      const double scale = std::max(1.0, yr.abs().max().item<double>());
      const double err = (y.to(at::kFloat) - yr).abs().max().item<double>() / scale;
      EXPECT_LE(err, bound) << names[kind] << " " << dtype;
      EXPECT_GT(err, 0.0) << names[kind] << " " << dtype << " ran in fp32";
      const double gscale = std::max(1.0, xr.grad().abs().max().item<double>());
      const double gerr = (x.grad().to(at::kFloat) - xr.grad()).abs().max().item<double>() / gscale;
      EXPECT_LE(gerr, bound) << names[kind] << " " << dtype << " input gradient";
    }
  }
}

// FP8 GEMMs take bf16 inputs and give bf16 outputs and gradients; their state stays fp32.
// A bf16 GEMM accumulates in fp32 whatever its size, as TE's do: its result is the exact product
// of the bf16 operands rounded once (2^-8 of the magnitude). LibTorch 1.13's CPU runs GEMMs of at
// most 16*16*16 multiply-adds in a kernel that accumulates in bf16 (1e-2 off at k = 16), so small
// ones take te-cpp's fp32 route; large ones oneDNN's (fp32 accumulation). Forward and both
// gradients, small and large.
TEST(ReducedPrecision, Bf16GemmsAccumulateInFp32AtEverySize) {
  for (const auto& [m, k, n] :
       {std::tuple<int64_t, int64_t, int64_t>{24, 8, 16}, {6, 16, 6}, {4, 4, 4}, {64, 256, 64}}) {
    const at::Tensor x = randn({m, k}, 7).to(at::kBFloat16).requires_grad_(true);
    const at::Tensor w = randn({k, n}, 8).to(at::kBFloat16).requires_grad_(true);
    const at::Tensor g = randn({m, n}, 9).to(at::kBFloat16);
    const at::Tensor y = functional::dense(x, w);
    torch::autograd::backward({y}, {g});
    const at::Tensor xd = x.detach().to(at::kDouble), wd = w.detach().to(at::kDouble);
    const at::Tensor gd = g.to(at::kDouble);
    for (const auto& [got, want, what] :
         {std::tuple<at::Tensor, at::Tensor, const char*>{y, at::mm(xd, wd), "output"},
          {x.grad(), at::mm(gd, wd.t()), "input gradient"},
          {w.grad(), at::mm(xd.t(), gd), "kernel gradient"}}) {
      const double err =
          ((got.detach().to(at::kDouble) - want).abs().max() / want.abs().max()).item<double>();
      EXPECT_LE(err, 1.0 / 256) << what << " of a " << m << "x" << k << " @ " << k << "x" << n
                                << " GEMM";
    }
  }
}

TEST(ReducedPrecision, Fp8TakesAndGivesBf16) {
  manual_seed(42);
  LayerNormMLP mlp(LayerNormMLPOptions(32, 64).intermediate_dropout_rate(0));
  const at::Tensor x32 = test::randn({4, 16, 32}, 43);
  const at::Tensor ref = mlp(x32).detach();
  mlp->to(at::kBFloat16);
  at::Tensor x = x32.to(at::kBFloat16).requires_grad_(true);
  at::Tensor y;
  {
    Fp8Autocast fp8(true, fp8::DelayedScaling{});
    y = mlp(x);
    y.sum().backward();
  }
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  EXPECT_EQ(x.grad().scalar_type(), at::kBFloat16);
  EXPECT_EQ(mlp->wi_kernel.grad().scalar_type(), at::kBFloat16);
  EXPECT_EQ(mlp->wi_fp8->fwd_scale.scalar_type(), at::kFloat);
  EXPECT_EQ(mlp->wi_fp8->fwd_amax_history.scalar_type(), at::kFloat);
  // Two FP8 GEMMs (see the FP8 module tests' 10% bound) plus bf16 rounding.
  const double rel = ((y.detach().to(at::kFloat) - ref).norm() / ref.norm()).item<double>();
  EXPECT_LT(rel, 0.12);
  EXPECT_GT(rel, 1e-4);
}

}  // namespace
}  // namespace te::nn
