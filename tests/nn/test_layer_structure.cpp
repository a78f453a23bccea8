// TransformerLayer's structures (post-LN, residual from the norm, parallel attention and MLP,
// stochastic depth), MultiHeadAttention's qk-norm, and TE-PyTorch's activation names, on one
// process against the same blocks composed by hand or the formulas written out.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "../expect_error.h"
#include "nn_test_util.h"
#include "te/nn.h"

namespace te::nn {
namespace {

namespace F = functional;
using test::Close;
using test::leaf;
using test::randn;

TEST(Activations, TePyTorchNamesAreTheirFormulas) {
  // transformer_engine/common/util/math.h and layernorm_mlp.py at d0067d0da: the gated forms
  // activate the first half and multiply by the second.
  const at::Tensor h = randn({3, 2, 5}, 1) * 3;  // [..., slots, n]
  const at::Tensor a = h.select(-2, 0), b = h.select(-2, 1);
  const auto gelu = [](const at::Tensor& x) { return at::gelu(x, "tanh"); };
  EXPECT_TRUE(Close(F::mlp_activation(h, {"swiglu"}), at::silu(a) * b));
  EXPECT_TRUE(Close(F::mlp_activation(h, {"geglu"}), gelu(a) * b));
  // gelu_exact: the erf form (BERT's and transformers' "gelu"), which TE's gelu is not.
  EXPECT_TRUE(Close(F::activation(a, "gelu_exact"), at::gelu(a)));
  EXPECT_FALSE(Close(F::activation(a, "gelu_exact"), gelu(a)));
  EXPECT_TRUE(Close(F::mlp_activation(h, {"qgeglu"}), a * at::sigmoid(1.702 * a) * b));
  EXPECT_TRUE(Close(F::mlp_activation(h, {"reglu"}), at::relu(a) * b));
  EXPECT_TRUE(Close(F::mlp_activation(h, {"sreglu"}), at::relu(a).pow(2) * b));
  EXPECT_TRUE(Close(F::mlp_activation(h, {"glu"}), at::sigmoid(a) * b));
  const at::Tensor one = h.narrow(-2, 0, 1);
  EXPECT_TRUE(Close(F::mlp_activation(one, {"qgelu"}), a * at::sigmoid(1.702 * a)));
  EXPECT_TRUE(Close(F::mlp_activation(one, {"srelu"}), at::relu(a).pow(2)));
  EXPECT_TRUE(Close(F::mlp_activation(one, {"silu"}), at::silu(a)));
  // clamped_swiglu (gpt-oss): the gate clamped above at limit, the linear half to +-limit, plus
  // glu_linear_offset.
  for (const F::ActivationParams& p : {F::ActivationParams{}, F::ActivationParams{2.0, 1.0, 0.5}}) {
    const at::Tensor g = a.clamp_max(p.limit);
    EXPECT_TRUE(
        Close(F::mlp_activation(h, {"clamped_swiglu"}, p),
              g * at::sigmoid(p.alpha * g) * (b.clamp(-p.limit, p.limit) + p.glu_linear_offset)))
        << p.limit;
  }
  EXPECT_EQ(F::activation_slots({"clamped_swiglu"}),
            (std::vector<std::string>{"clamped_silu", "clamped_linear"}));
  EXPECT_EQ(F::activation_slots({"gelu", "linear"}), (std::vector<std::string>{"gelu", "linear"}));
  // A LayerNormMLP with a gated TE-PyTorch name has two fc1 slots.
  LayerNormMLP mlp(LayerNormMLPOptions(8, 12).activations({"swiglu"}));
  EXPECT_EQ(mlp->wi_kernel.sizes(), at::IntArrayRef({8, 2, 12}));
  EXPECT_ERROR(F::activation_slots({"swiglu", "linear"}),
               "'swiglu' is a whole TE-PyTorch activation (2 slots); give it alone");
  EXPECT_ERROR(LayerNormMLP(LayerNormMLPOptions(8, 12).activations({"mish"})),
               "activation 'mish' is not one of gelu, gelu_exact, relu, silu");
}

struct QkNormCase {
  std::string type;
  bool before_rope;
};

class QkNorm : public ::testing::TestWithParam<QkNormCase> {};

// MultiHeadAttention with qk-norm = its projections, the norm of each query and key head over
// head_dim, before or after RoPE, then attention and the output projection.
TEST_P(QkNorm, NormalisesEachHeadAroundRope) {
  const QkNormCase& c = GetParam();
  manual_seed(5);
  MultiHeadAttention mha([&] {
    auto made = MultiHeadAttentionOptions(16, 4)
                    .fuse_qkv(false)
                    .qk_norm_type(c.type)
                    .qk_norm_eps(1e-5)
                    .qk_norm_before_rope(c.before_rope);
    made.attention().attn_mask_type("causal");
    return made;
  }());
  const auto params = mha->named_parameters();
  EXPECT_EQ(params.contains("q_norm.scale"), c.type != "L2Normalization");
  if (mha->q_norm) {
    EXPECT_EQ(mha->q_norm->scale.sizes(), at::IntArrayRef({4}));  // head_dim, shared by heads
    torch::NoGradGuard no_grad;
    mha->q_norm->scale.copy_(randn({4}, 2));
    mha->k_norm->scale.copy_(randn({4}, 3));
    if (mha->q_norm->ln_bias.defined()) mha->k_norm->ln_bias.copy_(randn({4}, 4));
  }
  const at::Tensor x = randn({2, 5, 16}, 6);
  RotaryPositionEmbedding rope(RotaryPositionEmbeddingOptions(4).rotary_base(50.0));
  const at::Tensor freqs = rope->forward(5);
  const auto norm = [&](LayerNorm n, const at::Tensor& t) {
    if (c.type == "L2Normalization") return t / (t.pow(2).sum(-1, true) + 1e-5).sqrt();
    return n->forward(t);
  };
  const at::Tensor ln = mha->layernorm(x);
  at::Tensor q = at::matmul(ln, mha->q_kernel).view({2, 5, 4, 4});
  const at::Tensor kv = at::matmul(ln, mha->kv_kernel.reshape({16, 32})).view({2, 5, 2, 4, 4});
  at::Tensor k = kv.select(2, 0);
  if (c.before_rope) {
    q = norm(mha->q_norm, q);
    k = norm(mha->k_norm, k);
  }
  q = F::apply_rotary_pos_emb(q, freqs, "bshd");
  k = F::apply_rotary_pos_emb(k, freqs, "bshd");
  if (!c.before_rope) {
    q = norm(mha->q_norm, q);
    k = norm(mha->k_norm, k);
  }
  const at::Tensor want =
      at::matmul(mha->attention(q, k, kv.select(2, 1)).reshape({2, 5, 16}), mha->out_kernel);
  const at::Tensor y = mha(x, {}, {}, AttentionArgs().rotary_pos_emb(freqs));
  EXPECT_TRUE(Close(y, want, 1e-5)) << c.type;
  manual_seed(5);  // the same weights, no qk-norm
  MultiHeadAttention plain([&] {
    auto made = MultiHeadAttentionOptions(16, 4).fuse_qkv(false);
    made.attention().attn_mask_type("causal");
    return made;
  }());
  EXPECT_FALSE(Close(y, plain(x, {}, {}, AttentionArgs().rotary_pos_emb(freqs)), 1e-3));
}

INSTANTIATE_TEST_SUITE_P(Types, QkNorm,
                         ::testing::Values(QkNormCase{"RMSNorm", false},
                                           QkNormCase{"RMSNorm", true},
                                           QkNormCase{"LayerNorm", false},
                                           QkNormCase{"L2Normalization", true}),
                         [](const ::testing::TestParamInfo<QkNormCase>& info) {
                           return info.param.type + (info.param.before_rope ? "BeforeRope" : "");
                         });

// qk_norm_over_heads and clip_qkv (OLMoE's attention): each token's whole query (and whole key,
// of the kv heads) RMS-normed, then queries, keys and values clamped, then RoPE and attention.
TEST(QkNormOverHeads, NormalisesEachTokensHeadsTogetherThenClips) {
  manual_seed(5);
  MultiHeadAttention mha([&] {
    auto made = MultiHeadAttentionOptions(16, 4)
                    .fuse_qkv(false)
                    .qk_norm_type("RMSNorm")
                    .qk_norm_eps(1e-5)
                    .qk_norm_before_rope(true)
                    .qk_norm_over_heads(true)
                    .clip_qkv(0.6);
    made.attention().attn_mask_type("causal").num_gqa_groups(2);
    return made;
  }());
  ASSERT_EQ(mha->q_norm->scale.sizes(), at::IntArrayRef({16}));  // heads x head_dim
  ASSERT_EQ(mha->k_norm->scale.sizes(), at::IntArrayRef({8}));   // kv heads x head_dim
  {
    torch::NoGradGuard no_grad;
    mha->q_norm->scale.copy_(randn({16}, 2));
    mha->k_norm->scale.copy_(randn({8}, 3));
  }
  const at::Tensor x = randn({2, 5, 16}, 6);
  RotaryPositionEmbedding rope(RotaryPositionEmbeddingOptions(4).rotary_base(50.0));
  const at::Tensor freqs = rope->forward(5);
  const at::Tensor ln = mha->layernorm(x);
  const at::Tensor kv = at::matmul(ln, mha->kv_kernel.reshape({16, 16})).view({2, 5, 2, 8});
  auto clip = [](const at::Tensor& t) { return t.clamp(-0.6, 0.6); };
  at::Tensor q = clip(mha->q_norm(at::matmul(ln, mha->q_kernel)).view({2, 5, 4, 4}));
  at::Tensor k = clip(mha->k_norm(kv.select(2, 0)).view({2, 5, 2, 4}));
  const at::Tensor v = clip(kv.select(2, 1).view({2, 5, 2, 4}));
  EXPECT_GT((q.abs() == 0.6).sum().item<int64_t>(), 0);  // the clip is active
  q = F::apply_rotary_pos_emb(q, freqs, "bshd");
  k = F::apply_rotary_pos_emb(k, freqs, "bshd");
  const at::Tensor want = at::matmul(mha->attention(q, k, v).reshape({2, 5, 16}), mha->out_kernel);
  EXPECT_TRUE(Close(mha(x, {}, {}, AttentionArgs().rotary_pos_emb(freqs)), want, 1e-5));
  EXPECT_ERROR(MultiHeadAttention(MultiHeadAttentionOptions(16, 4)
                                      .qk_norm_type("L2Normalization")
                                      .qk_norm_over_heads(true)),
               "qk_norm_over_heads needs a qk_norm_type with a scale (RMSNorm or LayerNorm)");
  EXPECT_ERROR(MultiHeadAttention(MultiHeadAttentionOptions(16, 4).clip_qkv(-1)),
               "clip_qkv -1 must be finite and at least 0");
}

TransformerLayerOptions layer_options() {
  return [&] {
    auto made = TransformerLayerOptions(16, 24, 4).hidden_dropout(0).intermediate_dropout(0);
    made.self_attention().use_bias(true);
    made.self_attention().attention().attn_mask_type("padding").attention_dropout(0);
    return made;
  }();
}

// Rows of the given lengths in self attention (queries and keys alike).
at::Tensor mask_of(const std::vector<int64_t>& lengths, int64_t s) {
  return test::padding_mask(lengths, lengths, s, s);
}

TEST(LayerStructure, PostLnIsBertsLayer) {
  // output_layernorm + apply_residual_connection_post_layernorm (transformer.py L892-975 at
  // d0067d0da): h = x + attn(x) (no norm in front), then out = LN(mlp(LN'(h)) + LN'(h)).
  manual_seed(7);
  TransformerLayer layer(
      layer_options().output_layernorm(true).apply_residual_connection_post_layernorm(true));
  EXPECT_FALSE(layer->self_attention->layernorm);
  ASSERT_TRUE(layer->layernorm);
  const at::Tensor x = randn({2, 5, 16}, 8), mask = mask_of({5, 3}, 5);
  const at::Tensor h = x + layer->self_attention(x, {}, mask);
  const auto [m, ln] = layer->mlp->forward_with_layernorm_output(h);
  EXPECT_TRUE(Close(ln, layer->mlp->layernorm(h)));
  EXPECT_TRUE(Close(layer(x, mask), layer->layernorm(m + ln), 1e-6));
  // The residual from the norm alone (Megatron's option): each block's residual is its norm's
  // output.
  manual_seed(7);
  TransformerLayer from_norm(layer_options().apply_residual_connection_post_layernorm(true));
  const at::Tensor h2 =
      from_norm->self_attention(x, {}, mask) + from_norm->self_attention->layernorm(x);
  EXPECT_TRUE(Close(from_norm(x, mask), from_norm->mlp(h2) + from_norm->mlp->layernorm(h2), 1e-6));
}

TEST(LayerStructure, OutputLayernormAloneAndADecodersNormResiduals) {
  // output_layernorm alone: no norm before the self attention, every residual the block's
  // input, the norm last.
  manual_seed(14);
  TransformerLayer out_ln(layer_options().output_layernorm(true));
  const at::Tensor x = randn({2, 5, 16}, 15), mask = mask_of({5, 3}, 5);
  const at::Tensor h = x + out_ln->self_attention(x, {}, mask);
  EXPECT_TRUE(Close(out_ln(x, mask), out_ln->layernorm(h + out_ln->mlp(h)), 1e-6));
  // A decoder with residuals from the norms: the cross attention's residual is its norm's
  // output too.
  manual_seed(16);
  TransformerLayer dec([&] {
    auto made =
        layer_options().layer_type("decoder").apply_residual_connection_post_layernorm(true);
    made.self_attention().attention().attn_mask_type("causal");
    return made;
  }());
  const at::Tensor memory = randn({2, 5, 16}, 17), memory_mask = mask_of({5, 4}, 5);
  const at::Tensor h1 = dec->self_attention(x) + dec->self_attention->layernorm(x);
  const at::Tensor h2 =
      dec->cross_attention(h1, memory, memory_mask) + dec->cross_attention->layernorm(h1);
  EXPECT_TRUE(Close(dec(x, {}, memory, memory_mask), dec->mlp(h2) + dec->mlp->layernorm(h2), 1e-6));
}

TEST(LayerStructure, PostBlockNormsNormaliseEachBlocksOutputBeforeItsResidual) {
  // Gemma 2's decoder layer (transformers 5.23.0 models/gemma2/modeling_gemma2.py
  // Gemma2DecoderLayer): h = x + post_attention_layernorm(attn(input_layernorm(x))), then
  // out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))).
  manual_seed(21);
  auto options = layer_options().post_block_layernorm(true).mlp_activations({"gelu", "linear"});
  options.self_attention().layernorm().layernorm_type("rmsnorm").zero_centered_gamma(true);
  TransformerLayer layer(options);
  ASSERT_TRUE(layer->post_attention_layernorm && layer->post_mlp_layernorm);
  EXPECT_TRUE(layer->post_mlp_layernorm->options.zero_centered_gamma());
  {
    torch::NoGradGuard no_grad;  // scales away from their initial value, each its own
    layer->post_attention_layernorm->scale.copy_(randn({16}, 22) * 0.3);
    layer->post_mlp_layernorm->scale.copy_(randn({16}, 23) * 0.3);
  }
  const at::Tensor x = randn({2, 5, 16}, 24), mask = mask_of({5, 3}, 5);
  const at::Tensor h = x + layer->post_attention_layernorm(layer->self_attention(x, {}, mask));
  const at::Tensor want = h + layer->post_mlp_layernorm(layer->mlp(h));
  EXPECT_TRUE(Close(layer(x, mask), want, 1e-6));
  // Without them the layer differs (the test can fail).
  manual_seed(21);
  TransformerLayer plain(layer_options().mlp_activations({"gelu", "linear"}));
  EXPECT_FALSE(Close(plain(x, mask), want, 1e-3));
  EXPECT_ERROR(TransformerLayer(layer_options().post_block_layernorm(true).layer_type("decoder")),
               "post_block_layernorm needs layer_type 'encoder' (got 'decoder') without "
               "parallel_attention_mlp");
}

TEST(LayerStructure, ZeroCenteredRmsNormScalesInFp32AsGemmas) {
  // Gemma2RMSNorm (transformers 5.23.0): (x_f32 * rsqrt(mean(x_f32^2) + eps) * (1 + w_f32))
  // cast to x's dtype at the end; Llama's casts before its scale. Bit for bit in bf16.
  const at::Tensor x = (randn({4, 64}, 31) * 3).to(at::kBFloat16);
  const at::Tensor w = (randn({64}, 32) * 0.5).to(at::kBFloat16);
  const at::Tensor xf = x.to(at::kFloat);
  const at::Tensor gemma =
      (xf * at::rsqrt(xf.pow(2).mean({-1}, true) + 1e-6) * (w.to(at::kFloat) + 1.0))
          .to(at::kBFloat16);
  const at::Tensor y = F::layer_norm(x, w, {}, 1e-6, /*zero_centered_gamma=*/true, /*rms=*/true);
  EXPECT_TRUE(at::equal(y, gemma));
  // The qk norms take the form too (Gemma 3's q_norm and k_norm).
  MultiHeadAttention mha(
      MultiHeadAttentionOptions(16, 4).qk_norm_type("RMSNorm").qk_norm_zero_centered_gamma(true));
  EXPECT_TRUE(mha->q_norm->options.zero_centered_gamma());
  EXPECT_TRUE(mha->k_norm->options.zero_centered_gamma());
}

TEST(LayerStructure, ParallelAttentionAndMlpShareTheInput) {
  manual_seed(9);
  TransformerLayer layer(layer_options().parallel_attention_mlp(true));
  const at::Tensor x = randn({2, 5, 16}, 10), mask = mask_of({5, 2}, 5);
  EXPECT_TRUE(Close(layer(x, mask), x + layer->self_attention(x, {}, mask) + layer->mlp(x), 1e-6));
  EXPECT_ERROR(TransformerLayer(layer_options().parallel_attention_mlp(true).layer_type("decoder")),
               "parallel_attention_mlp needs layer_type 'encoder', got 'decoder'");
  EXPECT_ERROR(
      TransformerLayer(layer_options().parallel_attention_mlp(true).output_layernorm(true)),
      "parallel_attention_mlp cannot be combined with "
      "apply_residual_connection_post_layernorm or output_layernorm");
}

TEST(LayerStructure, DropPathDropsWholeSamples) {
  manual_seed(11);
  const at::Tensor x = at::ones({64, 3, 4});
  const at::Tensor y = F::drop_path(x, 0.5, true);
  // Each sample is all 0 or all 1 / (1 - p) = 2, about half of each.
  const at::Tensor per_sample = y.view({64, -1});
  EXPECT_TRUE(at::equal(per_sample.amin(1), per_sample.amax(1)));
  EXPECT_TRUE(
      per_sample.select(1, 0).eq(0).logical_or(per_sample.select(1, 0).eq(2)).all().item<bool>());
  const int64_t kept = per_sample.select(1, 0).eq(2).sum().item<int64_t>();
  EXPECT_GT(kept, 16);
  EXPECT_LT(kept, 48);
  EXPECT_TRUE(at::equal(F::drop_path(x, 0.5, false), x));
  EXPECT_TRUE(at::equal(F::drop_path(x, 0.0, true), x));
  // A layer's drop path, everything else off: each sample keeps or drops the self attention's
  // and the MLP's branch, a kept one doubled (1 / (1 - p)); both happen across the batch.
  manual_seed(12);
  TransformerLayer layer([&] {
    auto made = layer_options().drop_path_rate(0.5);
    made.self_attention().attention().attn_mask_type("no_mask");
    return made;
  }());
  const at::Tensor xs = randn({16, 3, 16}, 13);
  const at::Tensor ys = layer(xs);  // training
  const at::Tensor attn = layer->self_attention(xs);
  int64_t kept_attn = 0, kept_mlp = 0;
  for (int64_t n = 0; n < 16; ++n) {
    int matches = 0;
    for (int a = 0; a < 2; ++a) {
      const at::Tensor h = xs[n] + 2.0 * a * attn[n];
      const at::Tensor mlp_h = layer->mlp(h.unsqueeze(0))[0];
      for (int m = 0; m < 2; ++m) {
        if (Close(ys[n], h + 2.0 * m * mlp_h, 1e-5)) {
          ++matches;
          kept_attn += a;
          kept_mlp += m;
        }
      }
    }
    EXPECT_EQ(matches, 1) << "sample " << n;
  }
  EXPECT_GT(kept_attn, 0);
  EXPECT_LT(kept_attn, 16);
  EXPECT_GT(kept_mlp, 0);
  EXPECT_LT(kept_mlp, 16);
  EXPECT_ERROR(TransformerLayer(layer_options().drop_path_rate(1.0)),
               "drop_path_rate 1 is not in [0, 1)");
  EXPECT_ERROR(F::drop_path(x, -0.1, true), "drop_path: probability -0.1 is not in [0, 1)");
}

// TE's kv_channels: DotProductAttention's (qk dim, v dim) (DeepSeek's 192 / 128 in small), on
// both paths and packed, against the formula; TransformerLayer's kv_channels sizes its kernels.
TEST(LayerStructure, KvChannelsGiveQueriesKeysAndValuesTheirOwnHeadDims) {
  const int64_t b = 2, sq = 5, sk = 7, h = 4, g = 2, dqk = 8, dv = 6;
  const at::Tensor q0 = randn({b, sq, h, dqk}, 61), k0 = randn({b, sk, g, dqk}, 62),
                   v0 = randn({b, sk, g, dv}, 63), dy = randn({b, sq, h, dv}, 64);
  // softmax(q k^T / sqrt(dqk)) v, bottom-right causal.
  at::Tensor q_ref = leaf(q0), k_ref = leaf(k0), v_ref = leaf(v0);
  const at::Tensor kr = k_ref.repeat_interleave(h / g, 2), vr = v_ref.repeat_interleave(h / g, 2);
  const at::Tensor hidden = at::ones({sq, sk}, at::kBool).triu(sk - sq + 1);
  const at::Tensor logits =
      at::einsum("bqhd,bkhd->bhqk", {q_ref, kr}).masked_fill(hidden, -1e10) / std::sqrt(8.0);
  const at::Tensor want = at::einsum("bhqk,bkhd->bqhd", {at::softmax(logits, -1), vr});
  want.backward(dy);
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "unfused");
    DotProductAttention dpa(DotProductAttentionOptions(h, dqk)
                                .head_dim_v(dv)
                                .num_gqa_groups(g)
                                .attn_mask_type("causal_bottom_right")
                                .fused(fused));
    at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
    const at::Tensor y = dpa(q, k, v);
    y.backward(dy);
    EXPECT_TRUE(Close(y, want, 1e-5));
    EXPECT_TRUE(Close(q.grad(), q_ref.grad(), 1e-5));
    EXPECT_TRUE(Close(k.grad(), k_ref.grad(), 1e-5));
    EXPECT_TRUE(Close(v.grad(), v_ref.grad(), 1e-5));
    EXPECT_ERROR(dpa(q0, k0, k0), "do not have head_dim 8 (q, k) and 6 (v) in their last dim");
  }
  // Packed: each sequence as in the batch above.
  DotProductAttention packed(DotProductAttentionOptions(h, dqk)
                                 .head_dim_v(dv)
                                 .num_gqa_groups(g)
                                 .attn_mask_type("padding_causal_bottom_right")
                                 .qkv_format("thd"));
  const at::Tensor cu_q = at::tensor(std::vector<int64_t>{0, sq, 2 * sq}),
                   cu_k = at::tensor(std::vector<int64_t>{0, sk, 2 * sk});
  const at::Tensor y = packed(q0.flatten(0, 1), k0.flatten(0, 1), v0.flatten(0, 1), {},
                              AttentionArgs().cu_seqlens_q(cu_q).cu_seqlens_kv(cu_k));
  EXPECT_TRUE(Close(y, want.detach().flatten(0, 1), 1e-5));
  TransformerLayer layer([&] {
    auto made = TransformerLayerOptions(16, 32, 4);
    made.self_attention().attention().head_dim(8);
    return made;
  }());
  EXPECT_EQ(layer->self_attention->qkv_kernel.sizes(), at::IntArrayRef({16, 3, 32}));
  EXPECT_EQ(layer->self_attention->out_kernel.sizes(), at::IntArrayRef({32, 16}));
  EXPECT_EQ(layer(randn({2, 3, 16}, 65)).sizes(), at::IntArrayRef({2, 3, 16}));
}

TEST(LayerStructure, ReportsAnUnknownQkNorm) {
  EXPECT_ERROR(MultiHeadAttention(MultiHeadAttentionOptions(16, 4).qk_norm_type("BatchNorm")),
               "qk_norm_type 'BatchNorm' is not one of RMSNorm, LayerNorm, L2Normalization");
}

}  // namespace
}  // namespace te::nn
