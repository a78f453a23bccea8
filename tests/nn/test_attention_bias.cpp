// Attention biases (TE's core_attention_bias_type: pre_scale_bias, post_scale_bias, alibi) and
// softmax types (vanilla, off-by-one, learnable) on one process, against references written
// with plain LibTorch ops (forward and every gradient, the bias's and the sink's included).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../expect_error.h"
#include "nn_test_util.h"
#include "te/compat.h"
#include "te/nn.h"

namespace te::nn {
namespace {

namespace F = functional;
using test::Close;
using test::leaf;
using test::padding_mask;
using test::randn;

// What TE's unfused backend computes (backends.py L619-711 at d0067d0da), written out: logits
// (q k^T + pre) * scale + post, hidden positions removed from the softmax, whose denominator
// gains exp(sink[h]) when `sink` is defined; a row with nothing visible is zero.
at::Tensor reference(const at::Tensor& q, at::Tensor k, at::Tensor v, const at::Tensor& hidden,
                     double scale, const at::Tensor& pre, const at::Tensor& post,
                     const at::Tensor& sink) {
  const int64_t rep = q.size(2) / k.size(2);
  k = k.repeat_interleave(rep, 2);
  v = v.repeat_interleave(rep, 2);
  at::Tensor logits = at::einsum("bqhd,bkhd->bhqk", {q, k});
  if (pre.defined()) logits = logits + pre;
  logits = logits * scale;
  if (post.defined()) logits = logits + post;
  const at::Tensor shown = hidden.logical_not().expand(logits.sizes()).to(at::kDouble);
  const at::Tensor lg = logits.to(at::kDouble);
  at::Tensor e = (lg - lg.amax(-1, true).detach()).exp() * shown;
  at::Tensor denom = e.sum(-1, true);
  if (sink.defined()) {
    denom = denom + (sink.to(at::kDouble).view({1, -1, 1, 1}) - lg.amax(-1, true).detach()).exp();
  }
  at::Tensor probs = e / denom.clamp_min(1e-300);
  // A row that sees no key: zero (TE's padded rows).
  probs = probs.masked_fill(hidden.all(-1, true), 0).to(q.scalar_type());
  return at::einsum("bhqk,bkhd->bqhd", {probs, v});
}

at::Tensor causal_hidden(int64_t sq, int64_t sk) {
  return at::ones({sq, sk}, at::kBool).triu(1).view({1, 1, sq, sk});
}

TEST(Alibi, SlopesAreTesForAnyHeadCount) {
  // utils.py L1926-1937 at d0067d0da: 2^(-8k/n) for the largest power of two n <= heads, then
  // 2^(-4(2k-1)/n) for the rest.
  const auto slopes = [](int64_t h) {
    const at::Tensor s = F::alibi_slopes(h);
    return std::vector<float>(s.data_ptr<float>(), s.data_ptr<float>() + s.numel());
  };
  const std::vector<float> eight = {0.5f,     0.25f,     0.125f,     0.0625f,
                                    0.03125f, 0.015625f, 0.0078125f, 0.00390625f};
  EXPECT_EQ(slopes(8), eight);
  std::vector<float> twelve = eight;
  for (double e : {-0.5, -1.5, -2.5, -3.5}) twelve.push_back(static_cast<float>(std::pow(2.0, e)));
  EXPECT_EQ(slopes(12), twelve);
  EXPECT_EQ(slopes(6), (std::vector<float>{0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f}));
  EXPECT_EQ(slopes(1), std::vector<float>{0.00390625f});
  EXPECT_ERROR(F::alibi_slopes(0), "num_heads 0 must be positive");
}

// ALiBi's bias, written out per element: -slope * |i - j + offset| with TE's offsets.
at::Tensor alibi_written_out(const at::Tensor& slopes, int64_t b, int64_t h, int64_t sq, int64_t sk,
                             const std::vector<int64_t>& offsets) {
  at::Tensor out = at::zeros({b, h, sq, sk});
  for (int64_t n = 0; n < b; ++n) {
    for (int64_t hh = 0; hh < h; ++hh) {
      const float s = slopes.dim() == 1 ? slopes[hh].item<float>() : slopes[n][hh].item<float>();
      for (int64_t i = 0; i < sq; ++i) {
        for (int64_t j = 0; j < sk; ++j) {
          out[n][hh][i][j] = -s * static_cast<float>(std::abs(i - j + offsets[n]));
        }
      }
    }
  }
  return out;
}

TEST(Alibi, TheBiasFollowsTheMasksDiagonal) {
  const int64_t b = 2, h = 4, sq = 3, sk = 5;
  const at::Tensor slopes = F::alibi_slopes(h);
  // Top-left for causal and padding_causal; bottom-right (offset sk - sq) otherwise; per
  // sequence (valid keys - valid queries) under a padding type.
  EXPECT_TRUE(Close(F::alibi_bias(slopes, F::mask_spec("causal"), {}, sq, sk),
                    alibi_written_out(slopes, 1, h, sq, sk, {0}), 0));
  EXPECT_TRUE(Close(F::alibi_bias(slopes, F::mask_spec("no_mask"), {}, sq, sk),
                    alibi_written_out(slopes, 1, h, sq, sk, {2}), 0));
  EXPECT_TRUE(Close(F::alibi_bias(slopes, F::mask_spec("no_mask", std::nullopt, false), {}, sq, sk),
                    alibi_written_out(slopes, 1, h, sq, sk, {0}), 0));
  const at::Tensor mask = padding_mask({3, 2}, {4, 5}, sq, sk);
  EXPECT_TRUE(
      Close(F::alibi_bias(slopes, F::mask_spec("padding_causal_bottom_right"), mask, sq, sk),
            alibi_written_out(slopes, b, h, sq, sk, {1, 3}), 0));
  EXPECT_TRUE(Close(F::alibi_bias(slopes, F::mask_spec("padding_causal"), mask, sq, sk),
                    alibi_written_out(slopes, 1, h, sq, sk, {0}), 0));
  // Per-sequence slopes [batch, heads].
  const at::Tensor per_row = at::stack({slopes, slopes.flip(0)});
  EXPECT_TRUE(Close(F::alibi_bias(per_row, F::mask_spec("no_mask"), {}, sq, sk),
                    alibi_written_out(per_row, b, h, sq, sk, {2, 2}), 0));
}

struct BiasCase {
  std::string bias_type;
  std::vector<int64_t> bias_shape;  // b, h, sq, sk as 1 or full
};

class AttentionBias : public ::testing::TestWithParam<BiasCase> {};

// Forward and every gradient (q, k, v and the bias) equal the reference, fused and unfused,
// with GQA and a padding mask whose padded rows stay zero.
TEST_P(AttentionBias, EqualsTheReferenceWithItsGradient) {
  const BiasCase& c = GetParam();
  const int64_t b = 2, h = 4, sq = 4, sk = 5;
  const at::Tensor mask = padding_mask({3, 4}, {5, 2}, sq, sk);
  const at::Tensor q0 = randn({b, sq, h, 8}, 1), k0 = randn({b, sk, 2, 8}, 2),
                   v0 = randn({b, sk, 2, 8}, 3), bias0 = randn(c.bias_shape, 4),
                   w = randn({b, sq, h, 8}, 5);
  const double scale = 0.3;
  // The reference.
  at::Tensor qr = leaf(q0), kr = leaf(k0), vr = leaf(v0), br = leaf(bias0);
  const at::Tensor hidden = mask.logical_or(causal_hidden(sq, sk));
  const bool pre = c.bias_type == "pre_scale_bias";
  const at::Tensor want =
      reference(qr, kr, vr, hidden, scale, pre ? br : at::Tensor(), pre ? at::Tensor() : br, {});
  (want * w).sum().backward();
  for (bool fused : {true, false}) {
    DotProductAttention dpa(DotProductAttentionOptions(h, 8)
                                .num_gqa_groups(2)
                                .attn_mask_type("padding_causal")
                                .scale_factor(scale)
                                .fused(fused));
    at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0), bias = leaf(bias0);
    const auto args =
        AttentionArgs().core_attention_bias_type(c.bias_type).core_attention_bias(bias);
    const at::Tensor y = dpa(q, k, v, mask, args);
    (y * w).sum().backward();
    const std::string what = c.bias_type + (fused ? " fused" : " unfused");
    EXPECT_TRUE(Close(y, want, 1e-5)) << what;
    EXPECT_TRUE(Close(q.grad(), qr.grad(), 1e-5)) << what;
    EXPECT_TRUE(Close(k.grad(), kr.grad(), 1e-5)) << what;
    EXPECT_TRUE(Close(v.grad(), vr.grad(), 1e-5)) << what;
    EXPECT_TRUE(Close(bias.grad(), br.grad(), 1e-5)) << what;
    // The padded query rows (query 3 of row 0) are still zero.
    EXPECT_EQ(y[0][3].abs().max().item<float>(), 0.0f) << what;
    // A bias that needs its gradient goes the unfused way (LibTorch's CPU flash kernel gives its
    // mask none); one that does not goes through SDPA, with the same values and q, k, v
    // gradients.
    EXPECT_EQ(dpa->fused_backend(q0, k0, v0, mask, args), "unfused") << what;
    const auto given =
        AttentionArgs().core_attention_bias_type(c.bias_type).core_attention_bias(bias0);
#if TE_HAS_SDPA
    EXPECT_EQ(dpa->fused_backend(q0, k0, v0, mask, given) != "unfused", fused) << what;
#endif
    at::Tensor q2 = leaf(q0), k2 = leaf(k0), v2 = leaf(v0);
    const at::Tensor y2 = dpa(q2, k2, v2, mask, given);
    (y2 * w).sum().backward();
    EXPECT_TRUE(Close(y2, want, 1e-5)) << what << " (bias without grad)";
    EXPECT_TRUE(Close(q2.grad(), qr.grad(), 1e-5)) << what << " (bias without grad)";
    EXPECT_TRUE(Close(k2.grad(), kr.grad(), 1e-5)) << what << " (bias without grad)";
    EXPECT_TRUE(Close(v2.grad(), vr.grad(), 1e-5)) << what << " (bias without grad)";
  }
}

INSTANTIATE_TEST_SUITE_P(BiasTypesAndShapes, AttentionBias,
                         ::testing::Values(BiasCase{"post_scale_bias", {2, 4, 4, 5}},
                                           BiasCase{"post_scale_bias", {1, 4, 4, 5}},
                                           BiasCase{"post_scale_bias", {2, 1, 4, 5}},
                                           BiasCase{"post_scale_bias", {1, 1, 4, 5}},
                                           BiasCase{"post_scale_bias", {1, 1, 1, 5}},
                                           BiasCase{"pre_scale_bias", {2, 4, 4, 5}},
                                           BiasCase{"pre_scale_bias", {1, 4, 4, 5}}),
                         [](const ::testing::TestParamInfo<BiasCase>& info) {
                           std::string name =
                               info.param.bias_type == "pre_scale_bias" ? "PreScale" : "PostScale";
                           const char* dims = "bhqk";
                           for (int d = 0; d < 4; ++d) {
                             name += info.param.bias_shape[static_cast<std::size_t>(d)] == 1
                                         ? '1'
                                         : dims[d];
                           }
                           return name;
                         });

TEST(Alibi, AttentionWithAlibiIsAttentionWithItsBias) {
  // core_attention_bias_type "alibi" = post_scale_bias with alibi_bias(slopes, ...), for TE's
  // slopes and for user slopes of shape [heads] and [batch, heads], fused and unfused, with
  // per-sequence diagonals under padding_causal_bottom_right.
  const int64_t b = 2, h = 4, sq = 3, sk = 5;
  const at::Tensor q = randn({b, sq, h, 8}, 6), kv = randn({b, sk, h, 8}, 7);
  for (const std::string type : {"causal", "causal_bottom_right", "padding_causal_bottom_right"}) {
    const at::Tensor mask = padding_mask({3, 2}, {4, 5}, sq, sk);
    const F::MaskSpec spec = F::mask_spec(type);
    const at::Tensor given_mask = spec.padding() ? mask : at::Tensor();
    for (const at::Tensor& slopes : {at::Tensor(), randn({h}, 8).abs(), randn({b, h}, 9).abs()}) {
      for (bool fused : {true, false}) {
        DotProductAttention dpa(DotProductAttentionOptions(h, 8).attn_mask_type(type).fused(fused));
        const at::Tensor y =
            dpa(q, kv, kv, given_mask,
                AttentionArgs().core_attention_bias_type("alibi").alibi_slopes(slopes));
        const at::Tensor bias =
            F::alibi_bias(slopes.defined() ? slopes : F::alibi_slopes(h), spec, given_mask, sq, sk);
        const at::Tensor want = dpa(
            q, kv, kv, given_mask,
            AttentionArgs().core_attention_bias_type("post_scale_bias").core_attention_bias(bias));
        EXPECT_TRUE(Close(y, want, 1e-6)) << type << " fused " << fused;
        EXPECT_FALSE(Close(y, dpa(q, kv, kv, given_mask), 1e-3)) << type;
      }
    }
  }
}

class SoftmaxType : public ::testing::TestWithParam<std::string> {};

// off-by-one: each row's denominator gains exp(0); learnable: exp(softmax_offset[h]), a
// parameter with its gradient. Fused requests fall back to the unfused path (SDPA has no sink).
TEST_P(SoftmaxType, EqualsTheReferenceWithTheSinksGradient) {
  const std::string type = GetParam();
  const int64_t b = 2, h = 4, sq = 4, sk = 4;
  DotProductAttention dpa(
      DotProductAttentionOptions(h, 8).attn_mask_type("padding_causal").softmax_type(type));
  ASSERT_EQ(dpa->named_parameters().contains("softmax_offset"), type == "learnable");
  at::Tensor sink;
  if (type == "learnable") {
    EXPECT_TRUE(Close(dpa->softmax_offset, at::zeros({h}), 0));  // TE's initial value
    torch::NoGradGuard no_grad;
    dpa->softmax_offset.copy_(randn({h}, 10));
    sink = leaf(dpa->softmax_offset);
  } else if (type == "off-by-one") {
    sink = at::zeros({h});
  }
  const at::Tensor mask = padding_mask({4, 2}, {4, 2}, sq, sk);
  const at::Tensor q0 = randn({b, sq, h, 8}, 11), k0 = randn({b, sk, h, 8}, 12),
                   v0 = randn({b, sk, h, 8}, 13), w = randn({b, sq, h, 8}, 14);
  at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
  const at::Tensor y = dpa(q, k, v, mask);
  (y * w).sum().backward();
  at::Tensor qr = leaf(q0), kr = leaf(k0), vr = leaf(v0);
  const at::Tensor want = reference(qr, kr, vr, mask.logical_or(causal_hidden(sq, sk)),
                                    1.0 / std::sqrt(8.0), {}, {}, sink);
  (want * w).sum().backward();
  EXPECT_TRUE(Close(y, want, 1e-5)) << type;
  EXPECT_TRUE(Close(q.grad(), qr.grad(), 1e-5)) << type;
  EXPECT_TRUE(Close(k.grad(), kr.grad(), 1e-5)) << type;
  EXPECT_TRUE(Close(v.grad(), vr.grad(), 1e-5)) << type;
  if (type == "learnable") {
    ASSERT_TRUE(dpa->softmax_offset.grad().defined());
    EXPECT_TRUE(Close(dpa->softmax_offset.grad(), sink.grad(), 1e-5));
    EXPECT_GT(sink.grad().abs().max().item<float>(), 1e-3);
  }
  if (type != "vanilla") {
    EXPECT_EQ(dpa->fused_backend(q0, k0, v0, mask), "unfused");
    // A sink takes probability: the output differs from vanilla attention's.
    DotProductAttention vanilla(DotProductAttentionOptions(h, 8).attn_mask_type("padding_causal"));
    EXPECT_FALSE(Close(y, vanilla(q0, k0, v0, mask), 1e-3)) << type;
  }
  // Padded query rows (row 1's queries 2, 3) are zero, sink or not.
  EXPECT_EQ(y[1].narrow(0, 2, 2).abs().max().item<float>(), 0.0f) << type;
}

INSTANTIATE_TEST_SUITE_P(Types, SoftmaxType,
                         ::testing::Values("vanilla", "off-by-one", "learnable"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "off-by-one" ? std::string("OffByOne") : info.param;
                         });

TEST(SoftmaxType, LayersPassItAndTheArgsToTheirAttention) {
  TransformerLayer layer([&] {
    auto made = TransformerLayerOptions(16, 24, 4).layer_type("decoder").hidden_dropout(0);
    made.self_attention().attention().softmax_type("learnable").attention_dropout(0);
    return made;
  }());
  layer->eval();
  const auto params = layer->named_parameters();
  EXPECT_TRUE(params.contains("self_attention.attention.softmax_offset"));
  EXPECT_TRUE(params.contains("cross_attention.attention.softmax_offset"));
  EXPECT_EQ(params["self_attention.attention.softmax_offset"].sizes(), at::IntArrayRef({4}));
  // ALiBi reaches the self and the cross attention (as TE's TransformerLayer passes it): the
  // layer equals its blocks composed, each given the args.
  const at::Tensor x = randn({2, 5, 16}, 15), memory = randn({2, 5, 16}, 16);
  const at::Tensor memory_mask = at::zeros({2, 1, 5, 5}, at::kBool);
  const auto alibi = AttentionArgs().core_attention_bias_type("alibi");
  const at::Tensor h1 = x + layer->self_attention(x, {}, {}, alibi);
  const at::Tensor h2 = h1 + layer->cross_attention(h1, memory, memory_mask, alibi);
  EXPECT_TRUE(Close(layer(x, {}, memory, memory_mask, alibi), h2 + layer->mlp(h2), 1e-6));
  const at::Tensor h2_plain = h1 + layer->cross_attention(h1, memory, memory_mask);
  EXPECT_FALSE(Close(h2, h2_plain, 1e-4));
  // MultiHeadAttention with ALiBi = with the same bias given as post_scale_bias.
  MultiHeadAttention mha([&] {
    auto made = MultiHeadAttentionOptions(16, 4);
    made.attention().attn_mask_type("causal");
    return made;
  }());
  const at::Tensor bias = F::alibi_bias(F::alibi_slopes(4), F::mask_spec("causal"), {}, 5, 5);
  EXPECT_TRUE(Close(
      mha(x, {}, {}, AttentionArgs().core_attention_bias_type("alibi")),
      mha(x, {}, {},
          AttentionArgs().core_attention_bias_type("post_scale_bias").core_attention_bias(bias)),
      1e-6));
}

TEST(AttentionBias, ReportsBadInput) {
  const at::Tensor q = randn({2, 3, 4, 8}, 17);
  DotProductAttention dpa(DotProductAttentionOptions(4, 8).attn_mask_type("no_mask"));
  const auto with = [](const std::string& type) {
    return AttentionArgs().core_attention_bias_type(type);
  };
  EXPECT_ERROR(dpa(q, q, q, {}, with("relative")),
               "core_attention_bias_type 'relative' is not one of no_bias, pre_scale_bias, "
               "post_scale_bias, alibi");
  EXPECT_ERROR(dpa(q, q, q, {}, with("post_scale_bias")),
               "'post_scale_bias' needs core_attention_bias");
  EXPECT_ERROR(dpa(q, q, q, {}, with("no_bias").core_attention_bias(at::zeros({1, 4, 3, 3}))),
               "core_attention_bias_type 'no_bias' takes no core_attention_bias");
  EXPECT_ERROR(dpa(q, q, q, {}, with("alibi").core_attention_bias(at::zeros({1, 4, 3, 3}))),
               "core_attention_bias_type 'alibi' takes no core_attention_bias");
  EXPECT_ERROR(
      dpa(q, q, q, {}, with("pre_scale_bias").core_attention_bias(at::zeros({1, 3, 3, 3}))),
      "core_attention_bias [1, 3, 3, 3] does not fit the logits [batch 2, heads 4, "
      "seqlen_q 3, seqlen_kv 3]");
  EXPECT_ERROR(dpa(q, q, q, {}, with("post_scale_bias").core_attention_bias(at::zeros({4, 3, 3}))),
               "core_attention_bias [4, 3, 3] does not fit the logits");
  EXPECT_ERROR(
      dpa(q, q, q, {}, with("post_scale_bias").core_attention_bias(at::zeros({2, 4, 1, 3}))),
      "does not fit the logits");
  EXPECT_ERROR(dpa(q, q, q, {},
                   with("post_scale_bias").core_attention_bias(at::zeros({1, 4, 3, 3}, at::kLong))),
               "core_attention_bias is Long: give a floating-point tensor");
  EXPECT_ERROR(dpa(q, q, q, {}, with("alibi").alibi_slopes(at::ones({3}))),
               "alibi_slopes [3] are not [heads 4] or [batch 2, heads 4]");
  EXPECT_ERROR(dpa(q, q, q, {}, with("alibi").alibi_slopes(at::ones({2, 4, 1}))),
               "alibi_slopes [2, 4, 1] are not [heads 4]");
  EXPECT_ERROR(dpa(q, q, q, {}, AttentionArgs().alibi_slopes(at::ones({4}))),
               "alibi_slopes are given with core_attention_bias_type 'no_bias': they need 'alibi'");
  EXPECT_ERROR(dpa(q, q, q, {}, AttentionArgs().rotary_pos_emb(at::zeros({3, 1, 1, 8}))),
               "DotProductAttention takes no rotary_pos_emb");
  EXPECT_ERROR(DotProductAttention(DotProductAttentionOptions(4, 8).softmax_type("sink")),
               "softmax_type 'sink' is not one of vanilla, off-by-one, learnable");
  F::AttentionCall call;
  call.softmax_type = "learnable";
  EXPECT_ERROR(F::attention(q, q, q, call),
               "softmax_type 'learnable' needs softmax_offset of shape [4]");
  call.softmax_offset = at::zeros({3});
  EXPECT_ERROR(F::attention(q, q, q, call),
               "needs softmax_offset of shape [4] (one sink logit "
               "per head), got [3]");
  call.softmax_type = "off-by-one";
  EXPECT_ERROR(F::attention(q, q, q, call), "softmax_type 'off-by-one' takes no softmax_offset");
}

}  // namespace
}  // namespace te::nn
