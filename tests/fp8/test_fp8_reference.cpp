// FP8 LayerNormMLP and TransformerLayer against the same math written with plain LibTorch ops and
// the library's quantize (held bit-exact to cuda_fp8.h elsewhere): forward and every gradient,
// tight. The reference re-derives each FP8 GEMM from its definition, independently of
// te::fp8::linear's autograd function, scale bookkeeping and kernel cache:
//   forward  y  = (E4M3(x s_x) @ E4M3(w s_w)) / (s_x s_w)
//   backward gx = (E5M2(g s_g) @ E4M3(w s_w)^T) / (s_g s_w), gw = E4M3(x s_x)^T @ E5M2(g s_g) ...
// with the scales the module held when the step began (DelayedScaling, after one calibration
// step so they are not 1). The GEMMs run on the decoded codes with the same at::mm as the
// library's CPU path, so the comparison is at fp32 rounding.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <map>
#include <string>

#include "../nn/nn_test_util.h"
#include "te/fp8.h"
#include "te/nn.h"

namespace te::nn {
namespace {

using fp8::DType;
using test::Close;
using test::leaf;
using test::randn;

// The exact values of x's codes at `scale` (no scale applied back).
at::Tensor codes_of(const at::Tensor& x, float scale, DType dtype) {
  const fp8::Fp8Tensor q = fp8::quantize(x.contiguous(), at::full({1}, scale), dtype);
  return fp8::Fp8Tensor{q.data, at::ones({1}), dtype}.dequantize();
}

struct Scales {
  float x, w, g;
};

// One FP8 GEMM by its definition (HYBRID: E4M3 forward, E5M2 gradient).
class ReferenceFp8Gemm : public torch::autograd::Function<ReferenceFp8Gemm> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, double sx, double sw, double sg) {
    const int64_t k = w.size(0);
    const at::Tensor xc = codes_of(x.reshape({-1, k}), float(sx), DType::kE4M3);
    const at::Tensor wc = codes_of(w, float(sw), DType::kE4M3);
    ctx->save_for_backward({xc, wc});
    ctx->saved_data["sx"] = sx;
    ctx->saved_data["sw"] = sw;
    ctx->saved_data["sg"] = sg;
    ctx->saved_data["shape"] = x.sizes().vec();
    at::Tensor y = at::mm(xc, wc);
    y.mul_((1.0f / float(sx)) * (1.0f / float(sw)));
    std::vector<int64_t> out(x.sizes().begin(), x.sizes().end() - 1);
    out.push_back(w.size(1));
    return y.reshape(out);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &xc = saved[0], &wc = saved[1];
    const float sx = float(ctx->saved_data["sx"].toDouble());
    const float sw = float(ctx->saved_data["sw"].toDouble());
    const float sg = float(ctx->saved_data["sg"].toDouble());
    const at::Tensor gc = codes_of(grads[0].reshape({-1, wc.size(1)}), sg, DType::kE5M2);
    at::Tensor gx = at::mm(gc, wc.t().contiguous());
    gx.mul_((1.0f / sg) * (1.0f / sw));
    at::Tensor gw = at::mm(xc.t().contiguous(), gc);
    gw.mul_((1.0f / sx) * (1.0f / sg));
    return {gx.reshape(ctx->saved_data["shape"].toIntVector()), gw, {}, {}, {}};
  }
};

Scales scales_of(const fp8::GemmMeta& m) {
  return {m.fwd_scale[0].item<float>(), m.fwd_scale[1].item<float>(), m.bwd_scale[0].item<float>()};
}

at::Tensor gemm(const at::Tensor& x, const at::Tensor& w, const Scales& s) {
  return ReferenceFp8Gemm::apply(x, w, s.x, s.w, s.g);
}

at::Tensor activate(const at::Tensor& inner, const std::vector<std::string>& names) {
  at::Tensor act;
  for (std::size_t i = 0; i < names.size(); ++i) {
    at::Tensor slot = inner.select(-2, static_cast<int64_t>(i));
    at::Tensor a = names[i] == "gelu" ? at::gelu(slot, "tanh") : slot;  // "linear"
    act = act.defined() ? act * a : a;
  }
  return act;
}

at::Tensor reference_mlp(LayerNormMLPImpl& m, const at::Tensor& x,
                         std::map<std::string, at::Tensor>& leaves) {
  for (const auto& p : m.named_parameters()) leaves[p.key()] = leaf(p.value());
  const at::Tensor ln =
      at::layer_norm(x, {x.size(-1)}, leaves["layernorm.scale"], leaves["layernorm.ln_bias"], 1e-6);
  const at::Tensor& wi = leaves["wi_kernel"];
  at::Tensor inner = gemm(ln, wi.reshape({wi.size(0), -1}), scales_of(*m.wi_fp8));
  inner = inner.view({x.size(0), x.size(1), wi.size(1), wi.size(2)});
  return gemm(activate(inner, m.options.activations()), leaves["wo_kernel"], scales_of(*m.wo_fp8));
}

at::Tensor reference_attention(MultiHeadAttentionImpl& m, const at::Tensor& x,
                               const at::Tensor& mask, std::map<std::string, at::Tensor>& leaves) {
  for (const auto& p : m.named_parameters()) leaves[p.key()] = leaf(p.value());
  const int64_t b = x.size(0), s = x.size(1), h = m.options.attention().num_attention_heads();
  const int64_t d = m.head_dim();
  const at::Tensor ln =
      at::layer_norm(x, {x.size(-1)}, leaves["layernorm.scale"], leaves["layernorm.ln_bias"], 1e-6);
  const at::Tensor& w = leaves["qkv_kernel"];
  at::Tensor qkv = gemm(ln, w.reshape({w.size(0), -1}), scales_of(*m.qkv_fp8));
  qkv = qkv.view({b, s, 3, h, d});
  const at::Tensor q = qkv.select(2, 0), k = qkv.select(2, 1), v = qkv.select(2, 2);
  at::Tensor logits = at::einsum("bqhd,bkhd->bhqk", {q, k}).masked_fill(mask, -1e10);
  at::Tensor out = at::einsum("bhqk,bkhd->bqhd", {at::softmax(logits, -1), v});
  return gemm(out.reshape({b, s, h * d}), leaves["out_kernel"], scales_of(*m.out_fp8));
}

fp8::DelayedScaling short_history() {
  fp8::DelayedScaling recipe;
  recipe.amax_history_len = 4;
  return recipe;
}

// One forward and backward in FP8, so the delayed scales hold this input's amaxes.
template <typename Module, typename... Args>
void calibrate(Module& m, const at::Tensor& x, Args... args) {
  Fp8Autocast fp8(true, short_history());
  at::Tensor y = m(x.detach(), args...);
  y.backward(randn(y.sizes().vec(), 99));
  m->zero_grad();
}

void expect_gradients(torch::nn::Module& module, const std::string& prefix,
                      const std::map<std::string, at::Tensor>& leaves, int64_t& checked) {
  for (const auto& p : module.named_parameters()) {
    const at::Tensor& want = leaves.at(p.key()).grad();
    ASSERT_TRUE(p.value().grad().defined()) << prefix << p.key();
    ASSERT_TRUE(want.defined()) << prefix << p.key();
    EXPECT_TRUE(Close(p.value().grad(), want, 1e-6)) << prefix << p.key();
    ++checked;
  }
}

TEST(Fp8Reference, LayerNormMlpForwardAndEveryGradient) {
  for (const std::vector<std::string>& acts :
       {std::vector<std::string>{"gelu"}, std::vector<std::string>{"gelu", "linear"}}) {
    manual_seed(5);
    LayerNormMLP mlp(LayerNormMLPOptions(64, 128).activations(acts).intermediate_dropout_rate(0));
    const at::Tensor x0 = randn({4, 16, 64}, 6);
    calibrate(mlp, x0);
    // The step under test: its scales are the ones the calibration left.
    std::map<std::string, at::Tensor> leaves;
    at::Tensor xr = leaf(x0);
    at::Tensor yr = reference_mlp(*mlp, xr, leaves);
    const at::Tensor dy = randn(yr.sizes().vec(), 7);
    torch::autograd::backward({yr}, {dy});
    at::Tensor x = x0.clone().requires_grad_(true);
    {
      Fp8Autocast fp8(true, short_history());
      at::Tensor y = mlp(x);
      EXPECT_TRUE(Close(y, yr, 1e-6)) << acts.size() << " activations";
      y.backward(dy);
    }
    EXPECT_TRUE(Close(x.grad(), xr.grad(), 1e-6));
    int64_t checked = 0;
    expect_gradients(*mlp, "", leaves, checked);
    EXPECT_EQ(checked, 4);  // layernorm scale and bias, wi_kernel, wo_kernel
    // FP8 really ran: fp32 differs by far more than the tolerance.
    EXPECT_FALSE(Close(mlp(x0), yr, 1e-3));
  }
}

TEST(Fp8Reference, TransformerLayerForwardAndEveryGradient) {
  manual_seed(8);
  TransformerLayer layer([&] {
    auto made = TransformerLayerOptions(64, 128, 4)
                    .mlp_activations({"gelu", "linear"})
                    .hidden_dropout(0)
                    .intermediate_dropout(0);
    made.self_attention().attention().attn_mask_type("padding").attention_dropout(0);
    return made;
  }());
  const at::Tensor x0 = randn({2, 16, 64}, 9);
  const at::Tensor len = at::tensor(std::vector<int64_t>{16, 11}).view({-1, 1, 1, 1});
  const at::Tensor mask = at::arange(16).view({1, 1, 1, 16}).ge(len).expand({2, 1, 16, 16});
  calibrate(layer, x0, mask);
  std::map<std::string, std::map<std::string, at::Tensor>> refs;
  at::Tensor xr = leaf(x0);
  at::Tensor h = xr + reference_attention(*layer->self_attention, xr, mask, refs["self_attention"]);
  at::Tensor yr = h + reference_mlp(*layer->mlp, h, refs["mlp"]);
  const at::Tensor dy = randn(yr.sizes().vec(), 10);
  torch::autograd::backward({yr}, {dy});
  at::Tensor x = x0.clone().requires_grad_(true);
  {
    Fp8Autocast fp8(true, short_history());
    at::Tensor y = layer(x, mask);
    EXPECT_TRUE(Close(y, yr, 1e-6));
    y.backward(dy);
  }
  EXPECT_TRUE(Close(x.grad(), xr.grad(), 1e-6));
  int64_t checked = 0;
  expect_gradients(*layer->self_attention, "self_attention.", refs["self_attention"], checked);
  expect_gradients(*layer->mlp, "mlp.", refs["mlp"], checked);
  EXPECT_EQ(checked, static_cast<int64_t>(layer->parameters().size()));
}

}  // namespace
}  // namespace te::nn
