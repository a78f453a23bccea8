// Rotary position embeddings (te/nn/rope.h): TE's frequencies, the rotation against a
// complex-number reference, formats, start positions, packed sequences, partial rotary, the
// DTensor form on sequence-sharded input, MultiHeadAttention's relative positions, bad input.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
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

at::Tensor freqs_of(int64_t dim, int64_t len, bool interleaved = false, double base = 10000.0) {
  return RotaryPositionEmbedding(
             RotaryPositionEmbeddingOptions(dim).rotary_base(base).interleaved(interleaved))
      ->forward(len);
}

// The rotation written with complex numbers, independently of rope.cpp: position p turns the
// pair (a, b) (dims i and i + d2/2, or 2i and 2i+1 interleaved) by theta_i(p) = p / base^(2i/d2),
// (a + ib) * e^{i theta}. `pos` [b, s] gives each token's position; t is [b, s, h, d] (bshd).
at::Tensor reference_rope(const at::Tensor& t, const at::Tensor& pos, int64_t d2, bool interleaved,
                          double base = 10000.0) {
  const int64_t half = d2 / 2;
  const at::Tensor inv = 1.0 / at::pow(base, at::arange(0, d2, 2, at::kDouble) / double(d2));
  const at::Tensor theta = pos.to(at::kDouble).unsqueeze(-1).unsqueeze(-1) * inv;  // [b,s,1,half]
  const at::Tensor rot = at::polar(at::ones_like(theta), theta);
  const at::Tensor x = t.narrow(-1, 0, d2).to(at::kDouble);
  at::Tensor pairs;
  if (interleaved) {
    pairs = x.reshape({x.size(0), x.size(1), x.size(2), half, 2});
  } else {
    pairs = at::stack({x.narrow(-1, 0, half), x.narrow(-1, half, half)}, -1);
  }
  const at::Tensor z = at::view_as_real(at::view_as_complex(pairs.contiguous()) * rot);
  at::Tensor out = interleaved ? z.flatten(-2) : at::cat({z.select(-1, 0), z.select(-1, 1)}, -1);
  out = out.to(t.scalar_type());
  return d2 < t.size(-1) ? at::cat({out, t.narrow(-1, d2, t.size(-1) - d2)}, -1) : out;
}

at::Tensor positions(int64_t b, int64_t s, const std::vector<int64_t>& start = {}) {
  at::Tensor pos = at::arange(s).view({1, s}).expand({b, s});
  if (!start.empty()) pos = pos + at::tensor(start).view({b, 1});
  return pos;
}

TEST(RotaryPositionEmbedding, FrequenciesAreTes) {
  // inv_freq = 1 / base^(arange(0, dim, 2) / dim); freqs[p] = p * inv_freq, repeated for the two
  // halves (or each pair, interleaved), [s, 1, 1, dim] float32 (rope.py at d0067d0da).
  RotaryPositionEmbedding rope(RotaryPositionEmbeddingOptions(8).rotary_base(500.0));
  const at::Tensor inv = 1.0 / at::pow(500.0, at::arange(0, 8, 2, at::kDouble) / 8.0);
  EXPECT_TRUE(Close(rope->inv_freq.to(at::kDouble), inv, 1e-7));
  const at::Tensor f = rope->forward(5, 3);
  EXPECT_EQ(f.sizes(), at::IntArrayRef({5, 1, 1, 8}));
  EXPECT_EQ(f.scalar_type(), at::kFloat);
  const at::Tensor angles = (at::arange(3, 8, at::kDouble).view({5, 1}) * inv).to(at::kFloat);
  EXPECT_TRUE(Close(f.view({5, 8}), at::cat({angles, angles}, -1), 1e-7));
  const at::Tensor fi = freqs_of(8, 5, true, 500.0).view({5, 8});
  EXPECT_TRUE(at::equal(fi.slice(1, 0, 8, 2), fi.slice(1, 1, 8, 2)));
  EXPECT_TRUE(
      Close(fi.slice(1, 0, 8, 2), freqs_of(8, 5, false, 500.0).view({5, 8}).narrow(1, 0, 4)));
  EXPECT_TRUE(rope->named_buffers().contains("inv_freq"));
}

TEST(RotaryPositionEmbedding, RotaryPercentAndInterpolationAreTes) {
  // rotary_percent 0.5 of 8 rotates 4 dims.
  EXPECT_EQ(RotaryPositionEmbedding(RotaryPositionEmbeddingOptions(8).rotary_percent(0.5))
                ->forward(3)
                .size(-1),
            4);
  // Fixed linear scaling within pretrained * factor; dynamic beyond it (TE's two branches).
  auto scaled = [](int64_t len) {
    return RotaryPositionEmbedding(RotaryPositionEmbeddingOptions(4)
                                       .seq_len_interpolation_factor(2.0)
                                       .pretrained_max_position_embeddings(4))
        ->forward(len)
        .view({len, 4});
  };
  const at::Tensor plain8 = freqs_of(4, 8).view({8, 4}), plain12 = freqs_of(4, 12).view({12, 4});
  EXPECT_TRUE(Close(scaled(8), plain8 / 2.0, 1e-7));             // 8 <= 4 * 2: positions / 2
  EXPECT_TRUE(Close(scaled(12), plain12 * (4.0 / 12.0), 1e-7));  // 12 > 8: positions * 4 / 12
}

TEST(RotaryPositionEmbedding, LongFactorsPastThePretrainedLength) {
  // LongRoPE: frequency_factors up to pretrained_max_position_embeddings positions, the long
  // ones beyond, by the length offset + max_seq_len (transformers' max(position_ids) + 1).
  RotaryPositionEmbedding rope(RotaryPositionEmbeddingOptions(4)
                                   .frequency_factors({1.0, 2.0})
                                   .long_frequency_factors({4.0, 8.0})
                                   .pretrained_max_position_embeddings(6));
  const at::Tensor plain = freqs_of(4, 8).view({8, 4});
  const at::Tensor short_set = at::tensor({1.0, 2.0, 1.0, 2.0}, at::kFloat);
  const at::Tensor long_set = at::tensor({4.0, 8.0, 4.0, 8.0}, at::kFloat);
  EXPECT_TRUE(Close(rope->forward(6).view({6, 4}), plain.narrow(0, 0, 6) / short_set, 1e-7));
  EXPECT_TRUE(Close(rope->forward(7).view({7, 4}), plain.narrow(0, 0, 7) / long_set, 1e-7));
  EXPECT_TRUE(Close(rope->forward(3, 4).view({3, 4}), plain.narrow(0, 4, 3) / long_set, 1e-7));
  EXPECT_TRUE(Close(rope->forward(2, 4).view({2, 4}), plain.narrow(0, 4, 2) / short_set, 1e-7));
  EXPECT_TRUE(rope->named_buffers().contains("long_inv_freq"));
}

TEST(ApplyRotaryPosEmb, TheAttentionFactorScalesTheRotatedDimsOnly) {
  // transformers' cos * attention_scaling, sin * attention_scaling: the rotated dims scaled, the
  // passed-through ones (partial rotary) as they were.
  const at::Tensor t = randn({2, 5, 3, 8}, 1);
  const at::Tensor freqs = freqs_of(4, 5);
  const at::Tensor plain = F::apply_rotary_pos_emb(t, freqs, "bshd");
  const at::Tensor scaled = F::apply_rotary_pos_emb(t, freqs, "bshd", false, {}, {}, 1.5);
  EXPECT_TRUE(Close(scaled.narrow(-1, 0, 4), plain.narrow(-1, 0, 4) * 1.5, 1e-6));
  EXPECT_TRUE(at::equal(scaled.narrow(-1, 4, 4), t.narrow(-1, 4, 4)));
  // MultiHeadAttention passes AttentionArgs' factor on (the numbers: check_hf_models.py's YaRN
  // and LongRoPE cases against transformers); alone, it is refused.
  auto options = MultiHeadAttentionOptions(16, 4).scaled_query_init(false);
  MultiHeadAttention mha(options);
  const at::Tensor x = randn({1, 3, 16}, 2);
  const at::Tensor f4 = freqs_of(4, 3);
  const at::Tensor a =
      mha(x, {}, {}, AttentionArgs().rotary_pos_emb(f4).rotary_attention_factor(2));
  const at::Tensor b = mha(x, {}, {}, AttentionArgs().rotary_pos_emb(f4));
  EXPECT_FALSE(at::allclose(a, b));
  EXPECT_ERROR(mha(x, {}, {}, AttentionArgs().rotary_attention_factor(2)),
               "rotary_attention_factor 2 without rotary_pos_emb");
}

TEST(ApplyRotaryPosEmb, HalvesAndPairsTurnAsComplexNumbers) {
  for (bool interleaved : {false, true}) {
    for (int64_t d2 : {8, 4}) {  // full and partial rotary (the last 4 dims pass through)
      const at::Tensor t = randn({2, 5, 3, 8}, 1);
      const at::Tensor freqs = freqs_of(d2, 7, interleaved);
      const at::Tensor want = reference_rope(t, positions(2, 5), d2, interleaved);
      const at::Tensor got = F::apply_rotary_pos_emb(t, freqs, "bshd", interleaved);
      EXPECT_TRUE(Close(got, want, 1e-6)) << "interleaved " << interleaved << " d2 " << d2;
      if (d2 < 8) EXPECT_TRUE(at::equal(got.narrow(-1, d2, 8 - d2), t.narrow(-1, d2, 8 - d2)));
      // sbhd is the same rotation on the transposed tensor.
      EXPECT_TRUE(Close(F::apply_rotary_pos_emb(t.transpose(0, 1), freqs, "sbhd", interleaved),
                        want.transpose(0, 1), 1e-6));
    }
  }
}

TEST(ApplyRotaryPosEmb, GradientIsTheInverseRotation) {
  const at::Tensor t = leaf(randn({2, 4, 2, 6}, 2)), t_ref = leaf(t);
  const at::Tensor g = randn({2, 4, 2, 6}, 3);
  (F::apply_rotary_pos_emb(t, freqs_of(6, 4), "bshd") * g).sum().backward();
  (reference_rope(t_ref, positions(2, 4), 6, false) * g).sum().backward();
  EXPECT_TRUE(Close(t.grad(), t_ref.grad(), 1e-6));
}

TEST(ApplyRotaryPosEmb, LowPrecisionRotatesInFloat32) {
  const at::Tensor t = randn({1, 6, 2, 8}, 4).to(at::kBFloat16);
  const at::Tensor got = F::apply_rotary_pos_emb(t, freqs_of(8, 6), "bshd");
  EXPECT_EQ(got.scalar_type(), at::kBFloat16);
  // One rounding of the float32 result, as TE's fused kernel (cast once at the end).
  const at::Tensor want = reference_rope(t.to(at::kFloat), positions(1, 6), 8, false);
  EXPECT_TRUE(at::equal(got, want.to(at::kBFloat16)) || Close(got.to(at::kFloat), want, 1.0 / 128));
}

TEST(ApplyRotaryPosEmb, StartPositionsOffsetEachSequence) {
  const at::Tensor t = randn({3, 4, 2, 8}, 5);
  const at::Tensor start = at::tensor(std::vector<int64_t>{0, 5, 2});
  const at::Tensor freqs = freqs_of(8, 9);
  const at::Tensor want = reference_rope(t, positions(3, 4, {0, 5, 2}), 8, false);
  EXPECT_TRUE(Close(F::apply_rotary_pos_emb(t, freqs, "bshd", false, {}, start), want, 1e-6));
  EXPECT_TRUE(Close(F::apply_rotary_pos_emb(t.transpose(0, 1), freqs, "sbhd", false, {}, start),
                    want.transpose(0, 1), 1e-6));
}

TEST(ApplyRotaryPosEmb, PackedSequencesRestartTheirPositions) {
  // thd: sequences of 3, 0, 5 and 2 tokens; each is rotated as the same sequence alone.
  const std::vector<int64_t> lengths = {3, 0, 5, 2}, starts = {1, 0, 0, 4};
  const at::Tensor cu = at::tensor(std::vector<int32_t>{0, 3, 3, 8, 10});
  const at::Tensor t = randn({10, 2, 8}, 6);
  const at::Tensor freqs = freqs_of(8, 9, true);
  for (bool with_start : {false, true}) {
    const at::Tensor start = with_start ? at::tensor(starts) : at::Tensor();
    const at::Tensor got = F::apply_rotary_pos_emb(t, freqs, "thd", true, cu, start);
    int64_t offset = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      if (lengths[i] == 0) continue;
      const at::Tensor one = t.narrow(0, offset, lengths[i]).unsqueeze(0);
      const at::Tensor want =
          reference_rope(one, positions(1, lengths[i], {with_start ? starts[i] : 0}), 8, true);
      EXPECT_TRUE(Close(got.narrow(0, offset, lengths[i]), want.squeeze(0), 1e-6))
          << "sequence " << i << " start " << with_start;
      offset += lengths[i];
    }
  }
}

// A sequence-sharded t (sequence parallel) and batch/head shards: every rank rotates by its
// tokens' global positions, so the pieces are one process's result and so are the gradients.
TEST(RopeParallel, ASequenceShardedDTensorRotatesByGlobalPositions) {
  const at::Tensor global = randn({4, 6, 4, 8}, 7), g = randn({4, 6, 4, 8}, 8);
  const at::Tensor start = at::tensor(std::vector<int64_t>{0, 3, 1, 2});
  const at::Tensor freqs = freqs_of(8, 9);
  const at::Tensor ref_in = leaf(global);
  const at::Tensor want = F::apply_rotary_pos_emb(ref_in, freqs, "bshd", false, {}, start);
  (want * g).sum().backward();
  run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh({2, 2}, {"dp", "sp"});
    const std::vector<Placement> layout = {Shard{0}, Shard{1}};
    const DTensor x = DTensor::distribute(global, mesh, layout);
    const at::Tensor local = leaf(x.to_local());
    const DTensor y = F::apply_rotary_pos_emb(DTensor::from_local(local, mesh, layout, x.sizes()),
                                              freqs, "bshd", false, {}, start);
    EXPECT_TRUE(Close(y.to_local(), ::te::test::piece_of(want.detach(), mesh, layout, rank), 1e-6))
        << "rank " << rank;
    (y.to_local() * ::te::test::piece_of(g, mesh, layout, rank)).sum().backward();
    EXPECT_TRUE(Close(local.grad(), ::te::test::piece_of(ref_in.grad(), mesh, layout, rank), 1e-6));
    // Heads sharded over a mesh axis: the same.
    const std::vector<Placement> heads = {Shard{2}, Shard{1}};
    const DTensor yh = F::apply_rotary_pos_emb(DTensor::distribute(global, mesh, heads), freqs,
                                               "bshd", false, {}, start);
    EXPECT_TRUE(Close(yh.to_local(), ::te::test::piece_of(want.detach(), mesh, heads, rank), 1e-6));
    // A thd tensor may not be split on its tokens.
    const DTensor packed = DTensor::distribute(global.flatten(0, 1), mesh, {Shard{0}, Replicate{}});
    EXPECT_ERROR(F::apply_rotary_pos_emb(packed, freqs, "thd", false,
                                         at::tensor(std::vector<int64_t>{0, 6, 12, 18, 24})),
                 "is sharded on its token dim over mesh axis 'dp'");
  });
}

// RoPE makes the logits depend on relative positions only: shifting every position by the same
// offset leaves self attention's output unchanged, while no RoPE (or a different rotation)
// changes it.
TEST(MultiHeadAttentionRope, SelfAttentionSeesRelativePositionsOnly) {
  manual_seed(3);
  for (bool interleaved : {false, true}) {
    MultiHeadAttention mha([&] {
      auto made = MultiHeadAttentionOptions(16, 4).rotary_pos_interleaved(interleaved);
      made.attention().num_gqa_groups(2).attn_mask_type("causal");
      return made;
    }());
    const at::Tensor x = randn({2, 5, 16}, 9);
    RotaryPositionEmbedding rope(
        RotaryPositionEmbeddingOptions(4).rotary_base(50.0).interleaved(interleaved));
    const at::Tensor at0 = mha(x, {}, {}, AttentionArgs().rotary_pos_emb(rope->forward(5)));
    const at::Tensor at7 = mha(x, {}, {}, AttentionArgs().rotary_pos_emb(rope->forward(5, 7)));
    EXPECT_TRUE(Close(at0, at7, 1e-5)) << "interleaved " << interleaved;
    EXPECT_FALSE(Close(at0, mha(x), 1e-3));
    // The other pairing is another rotation.
    RotaryPositionEmbedding other(
        RotaryPositionEmbeddingOptions(4).rotary_base(50.0).interleaved(!interleaved));
    EXPECT_FALSE(
        Close(at0, mha(x, {}, {}, AttentionArgs().rotary_pos_emb(other->forward(5))), 1e-3));
  }
}

TEST(MultiHeadAttentionRope, TheQueriesAndKeysAreRotatedBeforeAttention) {
  // MultiHeadAttention with RoPE = its projections, apply_rotary_pos_emb on q and k, attention.
  manual_seed(4);
  MultiHeadAttention mha([&] {
    auto made = MultiHeadAttentionOptions(16, 4).fuse_qkv(false);
    made.attention().attn_mask_type("causal");
    return made;
  }());
  const at::Tensor x = randn({2, 5, 16}, 10);
  const at::Tensor freqs = freqs_of(4, 5, false, 50.0);
  const at::Tensor ln = mha->layernorm(x);
  const at::Tensor q = at::matmul(ln, mha->q_kernel).view({2, 5, 4, 4});
  const at::Tensor kv = at::matmul(ln, mha->kv_kernel.reshape({16, 32})).view({2, 5, 2, 4, 4});
  const at::Tensor attn =
      mha->attention(F::apply_rotary_pos_emb(q, freqs, "bshd"),
                     F::apply_rotary_pos_emb(kv.select(2, 0), freqs, "bshd"), kv.select(2, 1));
  const at::Tensor want = at::matmul(attn.reshape({2, 5, 16}), mha->out_kernel);
  EXPECT_TRUE(Close(mha(x, {}, {}, AttentionArgs().rotary_pos_emb(freqs)), want, 1e-5));
}

TEST(ApplyRotaryPosEmb, ReportsBadInput) {
  const at::Tensor t = randn({2, 4, 2, 8}, 11);
  const at::Tensor freqs = freqs_of(8, 6);
  EXPECT_ERROR(F::apply_rotary_pos_emb(t, freqs, "bhsd"), "tensor_format 'bhsd' is not");
  EXPECT_ERROR(F::apply_rotary_pos_emb(t, freqs.view({6, 8})), "is not [s, 1, 1, rotary_dim]");
  EXPECT_ERROR(F::apply_rotary_pos_emb(t, freqs_of(16, 6), "bshd"),
               "the rotary dim 16 of freqs [6, 1, 1, 16] must be even and at most the head dim 8");
  EXPECT_ERROR(F::apply_rotary_pos_emb(t, freqs.narrow(3, 0, 3), "bshd"), "must be even");
  EXPECT_ERROR(F::apply_rotary_pos_emb(t, freqs_of(8, 3), "bshd"),
               "positions up to 3 need freqs for 4 positions, but freqs has 3");
  EXPECT_ERROR(
      F::apply_rotary_pos_emb(t, freqs, "bshd", false, {}, at::tensor(std::vector<int64_t>{0, 3})),
      "positions up to 6 need freqs for 7 positions");
  EXPECT_ERROR(F::apply_rotary_pos_emb(t, freqs, "bshd", false, {},
                                       at::tensor(std::vector<int64_t>{0, 1, 2})),
               "start_positions has 3 entries for 2 sequences");
  EXPECT_ERROR(
      F::apply_rotary_pos_emb(t, freqs, "bshd", false, {}, at::tensor(std::vector<int64_t>{0, -1})),
      "start_positions has a negative entry");
  EXPECT_ERROR(F::apply_rotary_pos_emb(t, freqs, "bshd", false, {}, at::tensor({0.5, 1.0})),
               "start_positions must be a 1-D integer tensor");
  EXPECT_ERROR(F::apply_rotary_pos_emb(t, freqs, "bshd", false, at::tensor({0, 4})),
               "cu_seqlens is for tensor_format 'thd'");
  const at::Tensor packed = randn({8, 2, 8}, 12);
  EXPECT_ERROR(F::apply_rotary_pos_emb(packed, freqs, "thd"), "'thd' needs cu_seqlens");
  EXPECT_ERROR(F::apply_rotary_pos_emb(packed, freqs, "thd", false, at::tensor({1, 8})),
               "cu_seqlens starts at 1, not 0");
  EXPECT_ERROR(F::apply_rotary_pos_emb(packed, freqs, "thd", false, at::tensor({0, 5, 3, 8})),
               "cu_seqlens decreases at entry 2 (5 -> 3)");
  EXPECT_ERROR(F::apply_rotary_pos_emb(packed, freqs, "thd", false, at::tensor({0, 4, 7})),
               "cu_seqlens ends at 7 but there are 8 tokens");
  EXPECT_ERROR(F::apply_rotary_pos_emb(packed, freqs, "thd", false, at::tensor({0, 8})),
               "positions up to 7 need freqs for 8 positions, but freqs has 6");
  EXPECT_ERROR(F::apply_rotary_pos_emb(t, freqs, "thd", false, at::tensor({0, 8})),
               "is not [tokens, heads, head_dim]");
  // What a step needs is each sequence's start plus its length, not the largest start plus the
  // longest sequence: one token at position 5 beside a chunk of 4 from 0 fits 6 positions.
  const at::Tensor mixed = randn({5, 2, 8}, 13);
  const at::Tensor rotated = F::apply_rotary_pos_emb(
      mixed, freqs, "thd", false, at::tensor({0, 1, 5}), at::tensor(std::vector<int64_t>{5, 0}));
  EXPECT_TRUE(at::allclose(
      rotated.slice(0, 0, 1),
      F::apply_rotary_pos_emb(mixed.slice(0, 0, 1), freqs, "thd", false, at::tensor({0, 1}),
                              at::tensor(std::vector<int64_t>{5}))));
  EXPECT_ERROR(RotaryPositionEmbedding(RotaryPositionEmbeddingOptions(7)),
               "the rotary dim 7 is not a positive even number");
  EXPECT_ERROR(RotaryPositionEmbedding(RotaryPositionEmbeddingOptions(8).rotary_percent(0.7)),
               "the rotary dim 5 (dim * rotary_percent) is not a positive even number");
  EXPECT_ERROR(
      RotaryPositionEmbedding(RotaryPositionEmbeddingOptions(8).seq_len_interpolation_factor(2)),
      "needs pretrained_max_position_embeddings");
  EXPECT_ERROR(RotaryPositionEmbedding(RotaryPositionEmbeddingOptions(8))->forward(0),
               "max_seq_len (0) must be positive");
  EXPECT_ERROR(
      RotaryPositionEmbedding(RotaryPositionEmbeddingOptions(4).long_frequency_factors({1, 2})),
      "long_frequency_factors need pretrained_max_position_embeddings");
  EXPECT_ERROR(RotaryPositionEmbedding(RotaryPositionEmbeddingOptions(4)
                                           .long_frequency_factors({1, 2, 3})
                                           .pretrained_max_position_embeddings(4)),
               "3 long_frequency_factors for 2 frequencies");
  EXPECT_ERROR(RotaryPositionEmbedding(RotaryPositionEmbeddingOptions(4).attention_factor(0)),
               "attention_factor 0 is not positive and finite");
  EXPECT_ERROR(F::apply_rotary_pos_emb(t, freqs, "bshd", false, {}, {}, -1.0),
               "attention_factor -1 is not positive and finite");
  // Through MultiHeadAttention: frequencies wider than its heads.
  MultiHeadAttention mha(MultiHeadAttentionOptions(16, 4));
  EXPECT_ERROR(mha(randn({1, 3, 16}, 13), {}, {}, AttentionArgs().rotary_pos_emb(freqs_of(8, 3))),
               "the rotary dim 8 of freqs [3, 1, 1, 8] must be even and at most the head dim 4");
}

}  // namespace
}  // namespace te::nn
