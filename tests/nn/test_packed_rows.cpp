// Rows of packed sequences (qkv_format "thd" with 2-D cu_seqlens [rows, sequences + 1]): each
// row attends as its own packed batch with RoPE restarting per sequence, as the row run alone;
// rows split over data-parallel ranks (heads over tensor-parallel ones) give one process's
// output, gradients and dropout; and the bad input.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

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

// Three rows of 8 tokens: two documents; one document and an empty sequence; two documents and
// three tokens of tail padding.
at::Tensor rows_cu() { return at::tensor({0, 3, 8, 0, 8, 8, 0, 2, 5}, at::kInt).view({3, 3}); }

MultiHeadAttentionOptions packed_mha(double dropout = 0.0) {
  auto o = MultiHeadAttentionOptions(16, 4);
  o.attention()
      .num_gqa_groups(2)
      .attn_mask_type("padding_causal")
      .qkv_format("thd")
      .attention_dropout(dropout);
  return o;
}

AttentionArgs rows_args(const at::Tensor& cu) {
  static RotaryPositionEmbedding rope(RotaryPositionEmbeddingOptions(4));
  return AttentionArgs().cu_seqlens_q(cu).cu_seqlens_kv(cu).rotary_pos_emb(rope->forward(8));
}

TEST(PackedRows, EachRowIsItsOwnPackedBatch) {
  const at::Tensor cu = rows_cu(), x0 = randn({3, 8, 16}, 1), w = randn({3, 8, 16}, 2);
  manual_seed(3);
  MultiHeadAttention mha(packed_mha());
  at::Tensor x = leaf(x0);
  const at::Tensor y = mha(x, {}, {}, rows_args(cu));
  (y * w).sum().backward();
  for (int64_t r = 0; r < 3; ++r) {
    SCOPED_TRACE(r);
    const int64_t end = cu[r][-1].item<int64_t>();  // the row alone: its sequences' tokens
    at::Tensor xr = leaf(x0[r].narrow(0, 0, end));
    const at::Tensor one = mha(xr, {}, {}, rows_args(cu[r]));
    EXPECT_TRUE(Close(y[r].narrow(0, 0, end), one, 1e-5));
    (one * w[r].narrow(0, 0, end)).sum().backward();
    EXPECT_TRUE(Close(x.grad()[r].narrow(0, 0, end), xr.grad(), 1e-5));
  }
  // The padding after row 2's last sequence takes no part: its output is zero.
  EXPECT_EQ(y[2].narrow(0, 5, 3).abs().max().item<float>(), 0.0f);
}

TEST(PackedRowsParallel, RowsSplitOverDataRanksAreOneProcess) {
  const at::Tensor cu = at::cat({rows_cu(), rows_cu().slice(0, 0, 1)});  // four rows
  const at::Tensor x0 = randn({4, 8, 16}, 11), w = randn({4, 8, 16}, 12);
  manual_seed(13);
  MultiHeadAttention one(packed_mha(0.3));
  at::Tensor x_ref = leaf(x0);
  manual_seed(14);
  const at::Tensor want = one(x_ref, {}, {}, rows_args(cu));
  (want * w).sum().backward();
  run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh({2, 2}, {"data", "tp"});
    MeshScope scope(mesh);
    MeshResourceScope resource(parse_mesh_resource("dp=data,tp=tp"));
    manual_seed(13);
    MultiHeadAttention mha(packed_mha(0.3));
    at::Tensor x = leaf(x0);
    manual_seed(14);
    const at::Tensor y = mha(DTensor::distribute(x, mesh, {Replicate{}, Replicate{}}), std::nullopt,
                             {}, rows_args(cu))
                             .full_tensor();
    EXPECT_TRUE(Close(y, want, 1e-5)) << "rank " << rank;
    (y * w).sum().backward();
    EXPECT_TRUE(Close(x.grad(), x_ref.grad(), 1e-5)) << "dx, rank " << rank;
  });
  run_local_ranks(2, [&](int) {  // rules that split a row's tokens are refused, naming the axis
    DeviceMesh mesh({2}, {"data"});
    MeshScope scope(mesh);
    AxisRulesScope rules(parse_axis_rules("seqlen=data"));
    MultiHeadAttention mha(packed_mha());
    EXPECT_ERROR(mha(DTensor::distribute(x0, mesh, {Replicate{}}), std::nullopt, {}, rows_args(cu)),
                 "are split on their tokens over mesh axis 'data'");
  });
}

TEST(PackedRows, ReportsBadInput) {
  const at::Tensor cu = rows_cu(), q = randn({3, 8, 2, 4}, 21);
  DotProductAttention dpa(
      DotProductAttentionOptions(2, 4).attn_mask_type("padding_causal").qkv_format("thd"));
  const auto args = [](const at::Tensor& c) {
    return AttentionArgs().cu_seqlens_q(c).cu_seqlens_kv(c);
  };
  EXPECT_ERROR(dpa(q[0], q[0], q[0], {}, args(cu)),
               "packed sequences [tokens, heads, head_dim] take 1-D cu_seqlens");
  EXPECT_ERROR(dpa(q, q, q, {}, args(cu[0])),
               "rows of packed sequences [rows, tokens, heads, "
               "head_dim] take 2-D cu_seqlens");
  EXPECT_ERROR(dpa(q, q, q, {}, args(cu.slice(0, 0, 2))),
               "DotProductAttention: cu_seqlens [2, 3] for 3 rows of packed sequences");
  at::Tensor long_row = cu.clone();
  long_row[1][2] = 9;
  EXPECT_ERROR(dpa(q, q, q, {}, args(long_row)),
               "DotProductAttention: cu_seqlens_q row 1 ends at 9 but there are only 8 tokens");
  EXPECT_ERROR(dpa(q, q, q, {}, AttentionArgs().cu_seqlens_q(cu).cu_seqlens_kv(cu.slice(1, 0, 2))),
               "cu_seqlens_q has 3 entries a row but cu_seqlens_kv has 2");
  EXPECT_ERROR(dpa(q, q, q, {}, args(cu).cu_seqlens_q_padded(cu.slice(1, 0, 2))),
               "cu_seqlens_q_padded [3, 2] is not the shape of cu_seqlens_q [3, 3]");
  EXPECT_ERROR(dpa(q, q, q, {}, args(cu).max_seqlen_q(4)),
               "max_seqlen_q 4 / max_seqlen_kv 0 are shorter than the longest sequence of the "
               "rows (8 / 8 tokens)");
  MultiHeadAttention mha(packed_mha());
  EXPECT_ERROR(mha(randn({2, 8, 16}, 22), {}, {}, rows_args(cu)),
               "MultiHeadAttention: 3 rows of cu_seqlens_q for input [2, 8, 16]");
  EXPECT_ERROR(mha(randn({2, 8, 16}, 22), {}, {}, rows_args(cu[0])),
               "rows of packed sequences [rows, tokens, hidden] take 2-D cu_seqlens");
}

}  // namespace
}  // namespace te::nn
