// Packed sequences (TE's qkv_format "thd" with cu_seqlens, and "sbhd"): DotProductAttention,
// MultiHeadAttention (RoPE restarting per sequence) and TransformerLayer on packed tokens against
// the same sequences run one by one in bshd, and against the padded batch with its padding mask
// (dropout included); heads sharded on Gloo ranks against one process; and the bad input.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "../distributed/dist_test_util.h"
#include "../expect_error.h"
#include "nn_test_util.h"
#include "te/nn.h"

namespace te::nn {
namespace {

namespace F = functional;
using test::Close;
using test::leaf;
using test::randn;

at::Tensor cumulative(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> cu = {0};  // TE's dtype
  for (const int64_t l : lengths) cu.push_back(cu.back() + static_cast<int32_t>(l));
  return at::tensor(cu);
}

std::string one_sequence_type(const std::string& type) {
  if (type == "padding") return "no_mask";
  if (type == "padding_causal") return "causal";
  return "causal_bottom_right";
}

// Three sequences (one empty of keys in cross attention), queries and keys of different lengths.
struct Packed {
  std::vector<int64_t> lq = {5, 2, 3}, lk = {4, 3, 6};
  int64_t h = 4, g = 2, d = 8;
};

TEST(PackedAttention, EachSequenceAttendsAloneAsIfRunOneByOne) {
  const Packed p;
  for (const std::string type : {"padding", "padding_causal", "padding_causal_bottom_right"}) {
    for (const bool window : {false, true}) {
      for (const bool padded : {false, true}) {
        SCOPED_TRACE(type + (window ? " window" : "") + (padded ? " padded" : ""));
        const bool causal = type != "padding";
        const std::optional<WindowSize> w =
            window ? std::optional<WindowSize>{WindowSize{1, causal ? 0 : 1}} : std::nullopt;
        // padded: one free slot after each sequence (cu_seqlens_*_padded), which stays zero.
        const int64_t gap = padded ? 1 : 0;
        std::vector<int64_t> slots_q, slots_k;
        for (std::size_t i = 0; i < 3; ++i) {
          slots_q.push_back(p.lq[i] + gap);
          slots_k.push_back(p.lk[i] + gap);
        }
        const at::Tensor cu_q = cumulative(p.lq), cu_k = cumulative(p.lk);
        const at::Tensor pad_q = cumulative(slots_q), pad_k = cumulative(slots_k);
        const int64_t tq = pad_q[-1].item<int64_t>(), tk = pad_k[-1].item<int64_t>();
        const at::Tensor q0 = randn({tq, p.h, p.d}, 1), k0 = randn({tk, p.g, p.d}, 2),
                         v0 = randn({tk, p.g, p.d}, 3), dy = randn({tq, p.h, p.d}, 4);
        const at::Tensor slopes = at::rand({3, p.h}) / 2;
        AttentionArgs args = AttentionArgs()
                                 .cu_seqlens_q(cu_q)
                                 .cu_seqlens_kv(cu_k)
                                 .core_attention_bias_type("alibi")
                                 .alibi_slopes(slopes);
        if (padded) args.cu_seqlens_q_padded(pad_q).cu_seqlens_kv_padded(pad_k);
        DotProductAttention packed(DotProductAttentionOptions(p.h, p.d)
                                       .num_gqa_groups(p.g)
                                       .attn_mask_type(type)
                                       .window_size(w)
                                       .qkv_format("thd"));
        at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
        const at::Tensor y = packed(q, k, v, {}, args);
        ASSERT_EQ(y.sizes(), q0.sizes());
        torch::autograd::backward({y}, {dy});
        DotProductAttention alone(DotProductAttentionOptions(p.h, p.d)
                                      .num_gqa_groups(p.g)
                                      .attn_mask_type(one_sequence_type(type))
                                      .window_size(w));
        for (int64_t i = 0; i < 3; ++i) {
          const int64_t sq = pad_q[i].item<int64_t>(), sk = pad_k[i].item<int64_t>();
          const int64_t nq = p.lq[i], nk = p.lk[i];
          at::Tensor qi = leaf(q0.narrow(0, sq, nq).unsqueeze(0)),
                     ki = leaf(k0.narrow(0, sk, nk).unsqueeze(0)),
                     vi = leaf(v0.narrow(0, sk, nk).unsqueeze(0));
          const at::Tensor yi =
              alone(qi, ki, vi, {},
                    AttentionArgs().core_attention_bias_type("alibi").alibi_slopes(slopes[i]));
          torch::autograd::backward({yi}, {dy.narrow(0, sq, nq).unsqueeze(0)});
          EXPECT_TRUE(Close(y.narrow(0, sq, nq), yi[0], 1e-5)) << "output of sequence " << i;
          EXPECT_TRUE(Close(q.grad().narrow(0, sq, nq), qi.grad()[0], 1e-5)) << "dq " << i;
          EXPECT_TRUE(Close(k.grad().narrow(0, sk, nk), ki.grad()[0], 1e-5)) << "dk " << i;
          EXPECT_TRUE(Close(v.grad().narrow(0, sk, nk), vi.grad()[0], 1e-5)) << "dv " << i;
          if (padded) {  // the free slots: zero output, no gradient
            EXPECT_EQ(y.narrow(0, sq + nq, gap).abs().max().item<float>(), 0.0f);
            EXPECT_EQ(k.grad().narrow(0, sk + nk, gap).abs().max().item<float>(), 0.0f);
          }
        }
      }
    }
  }
}

// The packed batch computes what the padded batch with its padding mask computes at the real
// tokens, dropout included: the packed sequences draw from the padded batch's positions.
// A KV cache's decoding step: F::paged_attention reads each sequence's keys and values from
// scattered pool rows and equals F::attention on the same keys gathered and packed, for every
// softmax type, with and without a sliding window, GQA, several new tokens per sequence, and a
// sequence whose first query sees no key (a zero row).
TEST(PagedAttention, EqualsPackedAttentionOverTheGatheredKeys) {
  const int64_t h = 4, g = 2, d = 8;
  const std::vector<int64_t> lq = {1, 3, 2}, lk = {5, 3, 7};
  const at::Tensor cu_q = at::tensor(std::vector<int64_t>{0, 1, 4, 6});
  const at::Tensor cu_k = at::tensor(std::vector<int64_t>{0, 5, 8, 15});
  const at::Tensor q = randn({6, h, d}, 21), k_pool = randn({20, g, d}, 22),
                   v_pool = randn({20, g, d}, 23);
  // Each sequence's keys at scattered rows (padding: row 19).
  const at::Tensor rows = at::tensor(std::vector<int64_t>{3, 7, 0,  12, 5,  19, 19,  //
                                                          1, 2, 18, 19, 19, 19, 19,  //
                                                          4, 6, 8,  9,  10, 11, 13})
                              .view({3, 7});
  std::vector<at::Tensor> gathered;
  for (int64_t i = 0; i < 3; ++i)
    gathered.push_back(rows[i].narrow(0, 0, lk[static_cast<std::size_t>(i)]));
  const at::Tensor all = at::cat(gathered);
  const at::Tensor k = k_pool.index_select(0, all), v = v_pool.index_select(0, all);
  for (const std::string softmax : {"vanilla", "off-by-one", "learnable"}) {
    for (const bool window : {false, true}) {
      F::AttentionCall call;
      call.spec = F::mask_spec("padding_causal_bottom_right",
                               window ? std::optional<WindowSize>(WindowSize{1, 0}) : std::nullopt);
      call.scale = 0.35;
      call.softmax_type = softmax;
      if (softmax == "learnable") call.softmax_offset = randn({h}, 24);
      // Sequence 1 has 3 queries and 3 keys; with 2 keys more than queries elsewhere the
      // bottom-right diagonal differs per sequence.
      const at::Tensor got =
          F::paged_attention(q, k_pool, v_pool, rows, cu_q, at::tensor(lk), call);
      call.packed = {cu_q, cu_k, {}, {}, 0, 0};
      const at::Tensor want = F::attention(q, k, v, call);
      EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-6))
          << softmax << (window ? " window" : "") << ": max diff "
          << (got - want).abs().max().item<float>();
    }
  }
  // A query that sees no key: 2 queries and 1 key on the bottom-right diagonal (the first query
  // sits before the only key).
  F::AttentionCall top_left;
  top_left.spec = F::mask_spec("padding_causal_bottom_right");
  const at::Tensor one = F::paged_attention(q.narrow(0, 0, 2), k_pool, v_pool, rows.narrow(0, 0, 1),
                                            at::tensor(std::vector<int64_t>{0, 2}),
                                            at::tensor(std::vector<int64_t>{1}), top_left);
  EXPECT_TRUE(at::equal(one[0], at::zeros({h, d})));
  EXPECT_FALSE(at::equal(one[1], at::zeros({h, d})));
  EXPECT_ERROR(
      F::paged_attention(q.to(at::kHalf), k_pool, v_pool, rows, cu_q, at::tensor(lk), top_left),
      "must be float32 or float64 CPU tensors of one dtype");
  EXPECT_ERROR(F::paged_attention(q, k_pool, v_pool, rows, cu_q,
                                  at::tensor(std::vector<int64_t>{5, 3, 8}), top_left),
               "sequence 2 has 2 queries and 8 keys (at most 7)");
}

TEST(PackedAttention, EqualsThePaddedBatchWithDropout) {
  const std::vector<int64_t> lengths = {6, 3, 5};
  const int64_t b = 3, s = 6, h = 2, d = 4;
  const at::Tensor padded_q = randn({b, s, h, d}, 5), padded_k = randn({b, s, h, d}, 6),
                   padded_v = randn({b, s, h, d}, 7);
  std::vector<at::Tensor> q_rows, k_rows, v_rows;
  for (int64_t i = 0; i < b; ++i) {
    q_rows.push_back(padded_q[i].narrow(0, 0, lengths[static_cast<std::size_t>(i)]));
    k_rows.push_back(padded_k[i].narrow(0, 0, lengths[static_cast<std::size_t>(i)]));
    v_rows.push_back(padded_v[i].narrow(0, 0, lengths[static_cast<std::size_t>(i)]));
  }
  const at::Tensor cu = cumulative(lengths);
  for (const std::string type : {"padding", "padding_causal"}) {
    SCOPED_TRACE(type);
    const auto options =
        DotProductAttentionOptions(h, d).attn_mask_type(type).attention_dropout(0.3);
    DotProductAttention dense(options),
        packed(DotProductAttentionOptions(options).qkv_format("thd"));
    manual_seed(9);
    const at::Tensor want =
        dense(padded_q, padded_k, padded_v, test::padding_mask(lengths, lengths, s, s));
    manual_seed(9);
    const at::Tensor got = packed(at::cat(q_rows), at::cat(k_rows), at::cat(v_rows), {},
                                  AttentionArgs().cu_seqlens_q(cu).cu_seqlens_kv(cu));
    EXPECT_EQ(rng_state().calls, 1u) << "one dropout call for the whole packed batch";
    int64_t at_token = 0;
    for (int64_t i = 0; i < b; ++i) {
      const int64_t n = lengths[static_cast<std::size_t>(i)];
      EXPECT_TRUE(Close(got.narrow(0, at_token, n), want[i].narrow(0, 0, n), 1e-5)) << i;
      at_token += n;
    }
  }
}

// A sequence without queries, one without keys (its queries see nothing: zero rows) and tokens
// after the last sequence (TE's tail padding): zeros, no gradient; dropout still one call.
TEST(PackedAttention, EmptySequencesAndTailPaddingAreZeros) {
  const at::Tensor cu_q = cumulative({3, 0, 2}), cu_k = cumulative({4, 3, 0});
  const at::Tensor q0 = randn({7, 2, 4}, 51), k0 = randn({9, 2, 4}, 52), v0 = randn({9, 2, 4}, 53);
  DotProductAttention dpa(DotProductAttentionOptions(2, 4)
                              .attn_mask_type("padding_causal_bottom_right")
                              .attention_dropout(0.2)
                              .qkv_format("thd"));
  DotProductAttention alone(DotProductAttentionOptions(2, 4).attn_mask_type("causal_bottom_right"));
  alone->eval();
  for (const bool training : {false, true}) {
    SCOPED_TRACE(training ? "training" : "eval");
    dpa->train(training);
    at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
    manual_seed(4);
    const at::Tensor y = dpa(q, k, v, {}, AttentionArgs().cu_seqlens_q(cu_q).cu_seqlens_kv(cu_k));
    EXPECT_EQ(rng_state().calls, training ? 1u : 0u);
    y.sum().backward();
    if (!training) {
      EXPECT_TRUE(Close(y.narrow(0, 0, 3),
                        alone(q0.narrow(0, 0, 3).unsqueeze(0), k0.narrow(0, 0, 4).unsqueeze(0),
                              v0.narrow(0, 0, 4).unsqueeze(0))[0],
                        1e-6));
    }
    // Tokens 3-4: the sequence without keys; 5-6: tail padding. Keys 7-8: tail padding.
    EXPECT_EQ(y.narrow(0, 3, 4).abs().max().item<float>(), 0.0f);
    EXPECT_EQ(q.grad().narrow(0, 3, 4).abs().max().item<float>(), 0.0f);
    EXPECT_EQ(k.grad().narrow(0, 7, 2).abs().max().item<float>(), 0.0f);
    EXPECT_GT(k.grad().narrow(0, 0, 4).abs().max().item<float>(), 0.0f);
  }
}

TEST(PackedAttention, SbhdIsBshdTransposed) {
  const at::Tensor q = randn({2, 5, 4, 8}, 11), k = randn({2, 7, 4, 8}, 12),
                   v = randn({2, 7, 4, 8}, 13);
  const auto options = DotProductAttentionOptions(4, 8).attn_mask_type("causal_bottom_right");
  DotProductAttention bshd(options), sbhd(DotProductAttentionOptions(options).qkv_format("sbhd"));
  EXPECT_TRUE(Close(sbhd(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)),
                    bshd(q, k, v).transpose(0, 1), 1e-6));
}

// MultiHeadAttention and TransformerLayer on packed tokens: each sequence as if alone (a batch
// of one), RoPE positions restarting at each sequence.
TEST(PackedAttention, LayersOnPackedTokensRunEachSequenceAlone) {
  const std::vector<int64_t> lengths = {4, 1, 6};
  const at::Tensor cu = cumulative(lengths);
  const int64_t hidden = 16, t = 11;
  const at::Tensor x0 = randn({t, hidden}, 21), dy = randn({t, hidden}, 22);
  RotaryPositionEmbedding rope(RotaryPositionEmbeddingOptions(4));
  const AttentionArgs args =
      AttentionArgs().cu_seqlens_q(cu).cu_seqlens_kv(cu).rotary_pos_emb(rope->forward(8));
  for (const bool layer : {false, true}) {
    SCOPED_TRACE(layer ? "TransformerLayer" : "MultiHeadAttention");
    std::function<at::Tensor(const at::Tensor&, const AttentionArgs&)> packed, alone;
    MultiHeadAttention mha_packed{nullptr}, mha_alone{nullptr};
    TransformerLayer tl_packed{nullptr}, tl_alone{nullptr};
    if (!layer) {
      const auto o = [&] {
        auto made = MultiHeadAttentionOptions(hidden, 4).qk_norm_type("RMSNorm");
        made.attention().num_gqa_groups(2);
        return made;
      }();
      manual_seed(3);
      mha_packed = MultiHeadAttention([&] {
        auto made = MultiHeadAttentionOptions(o);
        made.attention().attn_mask_type("padding_causal").qkv_format("thd");
        return made;
      }());
      manual_seed(3);
      mha_alone = MultiHeadAttention([&] {
        auto made = MultiHeadAttentionOptions(o);
        made.attention().attn_mask_type("causal");
        return made;
      }());
      packed = [&](const at::Tensor& x, const AttentionArgs& a) {
        return mha_packed(x, {}, {}, a);
      };
      alone = [&](const at::Tensor& x, const AttentionArgs& a) { return mha_alone(x, {}, {}, a); };
    } else {
      const auto o = [&] {
        auto made = TransformerLayerOptions(hidden, 32, 4)
                        .hidden_dropout(0)
                        .intermediate_dropout(0)
                        .mlp_activations({"gelu"});
        made.self_attention().attention().attention_dropout(0);
        return made;
      }();
      manual_seed(3);
      tl_packed = TransformerLayer([&] {
        auto made = TransformerLayerOptions(o);
        made.self_attention().attention().attn_mask_type("padding").qkv_format("thd");
        return made;
      }());
      manual_seed(3);
      tl_alone = TransformerLayer([&] {
        auto made = TransformerLayerOptions(o);
        made.self_attention().attention().attn_mask_type("no_mask");
        return made;
      }());
      packed = [&](const at::Tensor& x, const AttentionArgs& a) {
        return tl_packed(x, {}, {}, {}, a);
      };
      alone = [&](const at::Tensor& x, const AttentionArgs& a) {
        return tl_alone(x, {}, {}, {}, a);
      };
    }
    at::Tensor x = leaf(x0);
    const at::Tensor y = packed(x, args);
    ASSERT_EQ(y.sizes(), x0.sizes());
    torch::autograd::backward({y}, {dy});
    int64_t at_token = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      const int64_t n = lengths[i];
      at::Tensor xi = leaf(x0.narrow(0, at_token, n).unsqueeze(0));
      const at::Tensor yi = alone(xi, AttentionArgs().rotary_pos_emb(args.rotary_pos_emb()));
      torch::autograd::backward({yi}, {dy.narrow(0, at_token, n).unsqueeze(0)});
      EXPECT_TRUE(Close(y.narrow(0, at_token, n), yi[0], 1e-5)) << "sequence " << i;
      EXPECT_TRUE(Close(x.grad().narrow(0, at_token, n), xi.grad()[0], 1e-5)) << "dx " << i;
      at_token += n;
    }
    // [1, tokens, hidden] is the same call.
    EXPECT_TRUE(Close(packed(x0.unsqueeze(0), args)[0], y, 1e-6));
  }
}

// Heads sharded over TP2 (and replicated over DP2): the packed tokens give what one process gives.
TEST(PackedParallel, HeadsShardedOverTensorParallelRanksMatchOneProcess) {
  const std::vector<int64_t> lengths = {3, 5, 2};
  const at::Tensor cu = cumulative(lengths);
  const at::Tensor x0 = randn({10, 16}, 31), w = randn({10, 16}, 32);
  RotaryPositionEmbedding rope(RotaryPositionEmbeddingOptions(4));
  const AttentionArgs args =
      AttentionArgs().cu_seqlens_q(cu).cu_seqlens_kv(cu).rotary_pos_emb(rope->forward(8));
  const auto options = [&] {
    auto made = MultiHeadAttentionOptions(16, 4);
    made.attention().attn_mask_type("padding_causal").qkv_format("thd");
    return made;
  }();
  manual_seed(21);
  MultiHeadAttention one(options);
  at::Tensor x_ref = leaf(x0);
  const at::Tensor want = one(x_ref, {}, {}, args);
  (want * w).sum().backward();
  const at::Tensor s0 = randn({6, 2, 4, 4}, 34);
  const at::Tensor sbhd_want = DotProductAttention(
      DotProductAttentionOptions(4, 4).attn_mask_type("causal").qkv_format("sbhd"))(s0, s0, s0);
  const at::Tensor v3 = randn({6, 2, 4, 3}, 35);
  const at::Tensor dv_want = DotProductAttention(
      DotProductAttentionOptions(4, 4).head_dim_v(3).attn_mask_type("causal").fused(false))(s0, s0,
                                                                                            v3);
  run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh({2, 2}, {"data", "tp"});
    MeshScope scope(mesh);
    MeshResourceScope resource(parse_mesh_resource("tp=tp"));
    manual_seed(21);
    MultiHeadAttention mha(options);
    at::Tensor x = leaf(x0);
    const DTensor xd = DTensor::distribute(x, mesh, {Replicate{}, Replicate{}});
    const at::Tensor y = mha(xd, std::nullopt, {}, args).full_tensor();
    EXPECT_TRUE(Close(y, want, 1e-5)) << "rank " << rank;
    (y * w).sum().backward();
    ASSERT_TRUE(x.grad().defined());
    EXPECT_TRUE(Close(x.grad(), x_ref.grad(), 1e-5)) << "dx, rank " << rank;
    // sbhd with the batch split over 'data' and the heads over 'tp': one process's result.
    DotProductAttention sbhd(
        DotProductAttentionOptions(4, 4).attn_mask_type("causal").qkv_format("sbhd"));
    const DTensor sd = DTensor::distribute(s0, mesh, {Shard{1}, Shard{2}});
    EXPECT_TRUE(Close(sbhd(sd, sd, sd).full_tensor(), sbhd_want, 1e-6)) << rank;
    // A value head dim of its own (kv_channels) on sharded heads.
    DotProductAttention dv(
        DotProductAttentionOptions(4, 4).head_dim_v(3).attn_mask_type("causal").fused(false));
    const DTensor vd = DTensor::distribute(v3, mesh, {Shard{0}, Shard{2}});
    EXPECT_TRUE(
        Close(dv(sd.redistribute({Shard{0}, Shard{2}}), sd.redistribute({Shard{0}, Shard{2}}), vd)
                  .full_tensor(),
              dv_want, 1e-6))
        << rank;
    // Packed tokens split over a mesh axis are refused, naming it.
    DotProductAttention dpa(
        DotProductAttentionOptions(4, 4).attn_mask_type("padding").qkv_format("thd"));
    const DTensor split = DTensor::distribute(randn({10, 4, 4}, 33), mesh, {Shard{0}, Replicate{}});
    EXPECT_ERROR(dpa(split, split, split, {}, AttentionArgs().cu_seqlens_q(cu).cu_seqlens_kv(cu)),
                 "are split over mesh axis 'data'");
  });
}

TEST(PackedAttention, ReportsBadInput) {
  const at::Tensor t = randn({6, 2, 4}, 41);
  const auto thd = DotProductAttentionOptions(2, 4).attn_mask_type("padding").qkv_format("thd");
  DotProductAttention dpa(thd);
  const auto cu = [](std::vector<int64_t> v) { return at::tensor(v); };
  const auto call = [&](const AttentionArgs& a) { return dpa(t, t, t, {}, a); };
  const AttentionArgs good =
      AttentionArgs().cu_seqlens_q(cu({0, 2, 6})).cu_seqlens_kv(cu({0, 2, 6}));
  EXPECT_ERROR(DotProductAttention(DotProductAttentionOptions(2, 4).qkv_format("tbhd")),
               "qkv_format 'tbhd' is not one of bshd, sbhd, thd");
  EXPECT_ERROR(DotProductAttention(
                   DotProductAttentionOptions(2, 4).attn_mask_type("causal").qkv_format("thd")),
               "qkv_format 'thd' needs a padding attn_mask_type");
  EXPECT_ERROR(call(AttentionArgs()), "needs AttentionArgs' cu_seqlens_q and cu_seqlens_kv");
  EXPECT_ERROR(call(AttentionArgs(good).cu_seqlens_q(cu({1, 2, 6}))),
               "cu_seqlens_q starts at 1, not 0");
  EXPECT_ERROR(call(AttentionArgs(good).cu_seqlens_kv(cu({0, 4, 3, 6}))),
               "cu_seqlens_kv decreases at entry 2 (4 -> 3)");
  EXPECT_ERROR(call(AttentionArgs(good).cu_seqlens_q(cu({0, 2, 7}))),
               "cu_seqlens_q ends at 7 but there are only 6 tokens");
  EXPECT_ERROR(call(AttentionArgs(good).cu_seqlens_kv(cu({0, 6}))),
               "cu_seqlens_q has 3 entries but cu_seqlens_kv has 2");
  EXPECT_ERROR(
      call(AttentionArgs(good).cu_seqlens_q(cu({0, 2, 4})).cu_seqlens_q_padded(cu({0, 1, 6}))),
      "sequence 0 has 2 tokens (cu_seqlens_q) but only 1 slots in cu_seqlens_q_padded");
  EXPECT_ERROR(call(AttentionArgs(good).max_seqlen_q(3)),
               "max_seqlen_q 3 is shorter than the longest sequence (4 tokens)");
  EXPECT_ERROR(call(AttentionArgs(good).cu_seqlens_q(at::tensor({0.0, 6.0}))),
               "cu_seqlens_q must be a 1-D integer tensor");
  EXPECT_ERROR(dpa(t, t, t, at::zeros({1, 1, 6, 6}, at::kBool), good),
               "qkv_format 'thd' takes no mask");
  EXPECT_ERROR(call(AttentionArgs(good)
                        .core_attention_bias_type("post_scale_bias")
                        .core_attention_bias(at::zeros({1, 2, 6, 6}))),
               "core_attention_bias_type 'post_scale_bias' is not supported with qkv_format 'thd'");
  EXPECT_ERROR(
      call(AttentionArgs(good).core_attention_bias_type("alibi").alibi_slopes(at::ones({3, 2}))),
      "alibi_slopes [3, 2] are not [heads 2] or [sequences 2, heads 2]");
  EXPECT_ERROR(dpa(randn({6, 2, 2, 4}, 1), t, t, {}, good),
               "are not [tokens, heads, head_dim] (or [rows, tokens, heads, head_dim] with 2-D "
               "cu_seqlens) (qkv_format 'thd')");
  DotProductAttention bshd(DotProductAttentionOptions(2, 4).attn_mask_type("no_mask"));
  const at::Tensor b = randn({1, 6, 2, 4}, 42);
  EXPECT_ERROR(bshd(b, b, b, {}, good), "cu_seqlens are for qkv_format 'thd'");
  EXPECT_ERROR(bshd(b, b, b, {}, AttentionArgs().max_seqlen_q(5)),
               "max_seqlen_q 5 / max_seqlen_kv 0 differ from the 6 queries and 6 keys");
  EXPECT_ERROR(MultiHeadAttention([&] {
                 auto made = MultiHeadAttentionOptions(8, 2);
                 made.attention().qkv_format("sbhd");
                 return made;
               }()),
               "qkv_format 'sbhd' is not 'bshd' or 'thd'");
  EXPECT_ERROR(MultiHeadAttention([&] {
                 auto made = MultiHeadAttentionOptions(8, 2).self_attention(false);
                 made.attention().attn_mask_type("padding").qkv_format("thd");
                 return made;
               }()),
               "qkv_format 'thd' is for self attention");
  MultiHeadAttention mha([&] {
    auto made = MultiHeadAttentionOptions(8, 2);
    made.attention().attn_mask_type("padding").qkv_format("thd");
    return made;
  }());
  EXPECT_ERROR(mha(randn({2, 6, 8}, 43), {}, {}, good),
               "is not [tokens, 8] (or [1, tokens, hidden])");
  EXPECT_ERROR(TransformerLayer([&] {
                 auto made = TransformerLayerOptions(8, 16, 2).drop_path_rate(0.1);
                 made.self_attention().attention().attn_mask_type("padding").qkv_format("thd");
                 return made;
               }()),
               "drop_path_rate with attn_input_format 'thd' is not supported");
  EXPECT_ERROR(TransformerLayer([&] {
                 auto made = TransformerLayerOptions(8, 16, 2);
                 made.self_attention().attention().qkv_format("sbhd");
                 return made;
               }()),
               "attn_input_format 'sbhd' is not 'bshd' or 'thd'");
  EXPECT_ERROR(TransformerLayer([&] {
                 auto made = TransformerLayerOptions(8, 16, 2);
                 made.self_attention().attention().qkv_format("thd");
                 return made;
               }()),
               "attn_input_format 'thd' needs a padding self_attn_mask_type");
  EXPECT_ERROR(MultiHeadAttention([&] {
                 auto made = MultiHeadAttentionOptions(8, 2).enable_sequence_parallel(true);
                 made.attention().attn_mask_type("padding").qkv_format("thd");
                 return made;
               }()),
               "qkv_format 'thd' with enable_sequence_parallel is not supported");
  EXPECT_ERROR(dpa->fused_backend(randn({6, 8}, 44), t, t, {}, good),
               "are not [tokens, heads, head_dim]");
  EXPECT_ERROR(call(AttentionArgs(good).core_attention_bias(at::zeros({1, 2, 6, 6}))),
               "core_attention_bias_type 'no_bias' takes no core_attention_bias");
}

}  // namespace
}  // namespace te::nn
