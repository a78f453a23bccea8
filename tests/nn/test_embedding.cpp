// te::nn::Embedding: one process against at::embedding, and every layout (data parallel, FSDP,
// vocabulary-parallel rows, sharded columns, sequence-parallel output, uneven rows) against one
// process: the lookup, the tied logits (attend) and the table's gradient, on Gloo ranks.

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <mutex>

#include "../distributed/dist_test_util.h"
#include "../expect_error.h"
#include "te/nn.h"

namespace te::nn {
namespace {

using test::piece_of;

constexpr int64_t kBatch = 4, kSeq = 6, kFeatures = 8;

at::Tensor ids_of(int64_t vocab) {
  return at::remainder(at::arange(kBatch * kSeq, at::kLong) * 7 + 3, vocab).view({kBatch, kSeq});
}

TEST(Embedding, LooksUpRowsAndAttendsWithTheTransposedTable) {
  manual_seed(4);
  Embedding embed(EmbeddingOptions(11, kFeatures));
  const at::Tensor ids = ids_of(11);
  EXPECT_TRUE(at::equal(embed(ids), at::embedding(embed->embedding, ids)));
  const at::Tensor x = at::randn({kBatch, kSeq, kFeatures});
  EXPECT_TRUE(at::allclose(embed->attend(x), at::matmul(x, embed->embedding.t()), 1e-5, 1e-6));
  // Flax's nn.Embed init: normal with stddev 1/sqrt(features).
  Embedding big(EmbeddingOptions(4096, 64));
  EXPECT_NEAR(big->embedding.std().item<double>(), 0.125, 0.005);
}

TEST(Embedding, RefusesBadIdsAndTablesNamingThem) {
  Embedding embed(EmbeddingOptions(11, kFeatures));
  EXPECT_ERROR(embed(at::tensor(std::vector<int64_t>{1, 11}).view({1, 2})),
               "id 11 (element 1 of the ids) is outside the table's 11 rows [0, 11)");
  EXPECT_ERROR(embed(at::tensor(std::vector<int64_t>{-1}).view({1, 1})), "id -1 (element 0");
  EXPECT_ERROR(embed(at::ones({2, 2})), "ids are Float; give integer token ids");
  EXPECT_ERROR(Embedding(EmbeddingOptions(0, 4)), "0 x 4 table");
  EXPECT_ERROR(Embedding(EmbeddingOptions(4, 4).embedding_axes({"vocab"})),
               "has 1 names; give two (rows, columns)");
}

TEST(Embedding, Fp8WeightsDecodeTheRowsLookedUpWithOneScalePerRow) {
  manual_seed(6);
  Embedding embed(EmbeddingOptions(11, kFeatures).padding_idx(0));
  const at::Tensor table = embed->embedding.detach().clone();
  table[3].mul_(500);  // a row far out of the others' range keeps its own precision
  embed->embedding.detach().copy_(table);
  const at::Tensor ids = ids_of(11);
  const at::Tensor x = at::randn({kBatch, kSeq, kFeatures});
  EXPECT_EQ(freeze_fp8_weights(*embed), 1);
  EXPECT_TRUE(has_fp8_weights(*embed));
  EXPECT_FALSE(embed->embedding.defined());
  EXPECT_EQ(embed->named_parameters().size(), 0u);
  EXPECT_EQ(embed->fp8_embedding.scalar_type(), at::kByte);
  const auto [codes, scale_inv] = fp8::quantize_rows(table, fp8::DType::kE4M3);
  const at::Tensor decoded = fp8::dequantize_rows(codes, scale_inv, fp8::DType::kE4M3);
  c10::InferenceMode inference;
  EXPECT_TRUE(at::equal(embed(ids), at::embedding(decoded, ids)));
  EXPECT_TRUE(at::allclose(embed(ids), at::embedding(table, ids), 0.0625, 1e-6));
  EXPECT_TRUE(at::allclose(embed->attend(x), at::matmul(x, decoded.t()), 1e-5, 1e-6));
  EXPECT_EQ(freeze_fp8_weights(*embed), 0);  // already held in FP8
  EXPECT_ERROR(embed(at::tensor(std::vector<int64_t>{11}).view({1, 1})),
               "id 11 (element 0 of the ids) is outside the table's 11 rows");
  // A checkpoint of it loads into a fresh table laid out the same way.
  Embedding fresh(EmbeddingOptions(11, kFeatures));
  EXPECT_EQ(prepare_fp8_weights(*fresh), 1);
  EXPECT_EQ(fresh->fp8_embedding.sizes(), embed->fp8_embedding.sizes());
  EXPECT_EQ(fresh->fp8_embedding_scale_inv.sizes(), at::IntArrayRef({11}));
}

TEST(Embedding, Fp8WeightsAreRefusedOnAShardedTable) {
  te::run_local_ranks(2, [](int) {
    DeviceMesh mesh({2}, {"model"});
    MeshScope on(mesh);
    AxisRulesScope rules(parse_axis_rules("vocab=model"));
    Embedding embed(EmbeddingOptions(12, kFeatures));
    EXPECT_ERROR(freeze_fp8_weights(*embed), "holds sharded parameters; gather_module first");
    EXPECT_TRUE(embed->embedding.defined());
  });
}

// A tied head's gradient (attend) waits for GradientBuckets with the lookup's: one all-reduce
// over the data axis at finish(), for two micro-batches (attend's transposed kernel once
// all-reduced its part at once, in every backward).
TEST(EmbeddingParallel, ATiedHeadsGradientWaitsForTheBuckets) {
  te::run_local_ranks(2, [](int rank) {
    DeviceMesh mesh({2}, {"data"});
    MeshScope on(mesh);
    AxisRulesScope rules(parse_axis_rules("batch=data,vocab=,embed="));
    manual_seed(9);
    Embedding embed(EmbeddingOptions(16, kFeatures));
    const auto layout = placements_for(*resolve_logical_axes({"batch", "seqlen"}), mesh);
    const DTensor ids = DTensor::from_local(piece_of(ids_of(16), mesh, layout, rank), mesh, layout,
                                            std::vector<int64_t>{kBatch, kSeq});
    CommTrace trace;
    GradientBuckets buckets;
    for (int micro = 0; micro < 2; ++micro) {
      embed->attend(embed(ids)).to_local().sum().backward();
    }
    EXPECT_EQ(trace.count(Collective::kAllReduce), 0) << trace.table();
    buckets.finish();
    EXPECT_EQ(trace.count(Collective::kAllReduce), 1) << trace.table();
  });
}

struct Layout {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> axes;
  std::string rules;
  LogicalAxes ids_axes;
  LogicalAxes output_axes;
  int64_t vocab = 16;
  // Collectives of the lookup's forward: all-reduces, reduce-scatters, all-gathers (by kind).
  int64_t all_reduces = -1, reduce_scatters = -1;
};

void PrintTo(const Layout& l, std::ostream* os) { *os << l.name; }

class EmbeddingLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(EmbeddingLayouts, EqualOneProcess) {
  const Layout& l = GetParam();
  // One process: the reference lookup, logits and table gradients.
  manual_seed(9);
  Embedding one(EmbeddingOptions(l.vocab, kFeatures));
  const at::Tensor ids = ids_of(l.vocab);
  const at::Tensor y_ref = one(ids);
  const at::Tensor weight = test::seeded_integers({kBatch, kSeq, kFeatures}, 2).to(at::kFloat);
  const at::Tensor logit_weight = test::seeded_integers({kBatch, kSeq, l.vocab}, 3).to(at::kFloat);
  const at::Tensor logits_ref = one->attend(y_ref);
  ((y_ref * weight).sum() + (logits_ref * logit_weight).sum()).backward();
  const at::Tensor grad_ref = one->embedding.grad();

  int64_t world = 1;
  for (int64_t s : l.shape) world *= s;
  std::mutex mutex;
  run_local_ranks(static_cast<int>(world), [&](int rank) {
    DeviceMesh mesh(l.shape, l.axes);
    MeshScope mesh_scope(mesh);
    AxisRulesScope rules(parse_axis_rules(l.rules));
    manual_seed(9);
    Embedding embed(EmbeddingOptions(l.vocab, kFeatures).output_axes(l.output_axes));
    const auto ids_layout = placements_for(*resolve_logical_axes(l.ids_axes), mesh);
    const DTensor ids_d = DTensor::from_local(piece_of(ids, mesh, ids_layout, rank), mesh,
                                              ids_layout, std::vector<int64_t>{kBatch, kSeq});
    CommTrace trace;
    const DTensor y = embed(ids_d);
    if (l.all_reduces >= 0) {
      EXPECT_EQ(trace.count(Collective::kAllReduce), l.all_reduces) << trace.table();
      EXPECT_EQ(trace.count(Collective::kReduceScatter), l.reduce_scatters) << trace.table();
    }
    const DTensor logits = embed->attend(y);
    const at::Tensor y_full = y.full_tensor();
    EXPECT_TRUE(at::allclose(y_full, y_ref, 1e-6, 1e-6)) << "rank " << rank;
    EXPECT_TRUE(at::allclose(logits.full_tensor(), logits_ref, 1e-5, 1e-5)) << "rank " << rank;
    ((y_full * weight).sum() + (logits.full_tensor() * logit_weight).sum()).backward();
    const ParameterLayout& pl = embed->parameter_layouts().at("embedding");
    const at::Tensor want = pl.mesh ? piece_of(grad_ref, mesh, pl.placements, rank) : grad_ref;
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_TRUE(at::allclose(embed->embedding.grad(), want, 1e-4, 1e-5))
        << "table gradient on rank " << rank << "\n"
        << embed->embedding.grad() << want;
  });
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, EmbeddingLayouts,
    ::testing::Values(
        // The table replicated, the batch split: no collective forward.
        Layout{"DP2", {2}, {"data"}, "batch=data,vocab=,embed=", {"batch", "seqlen"},
               {"batch", "seqlen", "embed"}, 16, 0, 0},
        // Vocabulary-parallel (Megatron): one all-reduce of the partial lookups.
        Layout{"TP2Vocab", {2}, {"tp"}, "batch=,vocab=tp,embed=", {"batch", "seqlen"},
               {"batch", "seqlen", "embed"}, 16, 1, 0},
        // ... and a reduce-scatter into sequence shards under sequence parallelism.
        Layout{"TP2VocabSequenceParallel", {2}, {"tp"}, "batch=,vocab=tp,embed=,seqlen=tp",
               {"batch", std::nullopt}, {"batch", "seqlen", "embed"}, 16, 0, 1},
        // Rows split unevenly (torch.chunk: 9 + 8).
        Layout{"TP2VocabUneven", {2}, {"tp"}, "batch=,vocab=tp,embed=", {"batch", "seqlen"},
               {"batch", "seqlen", "embed"}, 17, 1, 0},
        // Columns split: the output's last dim, no collective.
        Layout{"TP2Embed", {2}, {"tp"}, "batch=,vocab=,embed=tp", {"batch", "seqlen"}, {}, 16, 0,
               0},
        // FSDP: rows split over the ranks that split the batch: gathered for the lookup.
        Layout{"FSDP2", {2}, {"fsdp"}, "batch=fsdp,vocab=fsdp,embed=", {"batch", "seqlen"},
               {"batch", "seqlen", "embed"}, 16, -1, -1},
        Layout{"DP2xTP2Vocab", {2, 2}, {"data", "tp"}, "batch=data,vocab=tp,embed=",
               {"batch", "seqlen"}, {"batch", "seqlen", "embed"}, 16, 1, 0}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace te::nn
