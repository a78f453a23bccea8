// The collective plan of one TransformerLayer forward + backward, counted by CommTrace, against
// the analytic plan of each layout. No extra collectives.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "../distributed/dist_test_util.h"
#include "te/nn.h"

namespace te::nn {
namespace {

using test::piece_of;

constexpr int64_t kB = 4, kS = 6, kH = 16, kF = 24;
constexpr int64_t kFloat = 4;
constexpr int64_t kActivation = kB * kS * kH * kFloat;  // one b*s*h activation
// Kernels: qkv (h, 3, h), out (h, h), fc1 (h, 1, f), fc2 (f, h); the two norms' scale and bias.
constexpr int64_t kKernels = (kH * 3 * kH + kH * kH + kH * kF + kF * kH) * kFloat;
constexpr int64_t kNorms = 4 * kH * kFloat;

struct Plan {
  int64_t all_reduce = 0, all_reduce_bytes = 0;
  int64_t all_gather = 0, all_gather_bytes = 0;
  int64_t reduce_scatter = 0, reduce_scatter_bytes = 0;
};

struct PlanCase {
  std::string name;
  std::string mesh_resource;
  std::string axis;
  bool sequence_parallel;
  Plan forward, backward;
  bool bucketed = false;
};

void expect_plan(const CommTrace& trace, const Plan& plan, const std::string& axis,
                 const std::string& what) {
  EXPECT_EQ(trace.count(Collective::kAllReduce, axis), plan.all_reduce) << what << trace.table();
  EXPECT_EQ(trace.bytes(Collective::kAllReduce, axis), plan.all_reduce_bytes) << what;
  EXPECT_EQ(trace.count(Collective::kAllGather, axis), plan.all_gather) << what << trace.table();
  EXPECT_EQ(trace.bytes(Collective::kAllGather, axis), plan.all_gather_bytes) << what;
  EXPECT_EQ(trace.count(Collective::kReduceScatter, axis), plan.reduce_scatter)
      << what << trace.table();
  EXPECT_EQ(trace.bytes(Collective::kReduceScatter, axis), plan.reduce_scatter_bytes) << what;
  EXPECT_EQ(trace.total_count(), plan.all_reduce + plan.all_gather + plan.reduce_scatter)
      << what << " has extra collectives:\n"
      << trace.table();
}

class TransformerPlan : public ::testing::TestWithParam<PlanCase> {};

TEST_P(TransformerPlan, CountsAndBytesMatchTheAnalyticPlan) {
  const PlanCase& c = GetParam();
  set_warning_handler([](std::string_view) {});
  run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh({2}, {c.axis});
    MeshScope mesh_scope(mesh);
    MeshResourceScope resource(parse_mesh_resource(c.mesh_resource));
    manual_seed(5);
    TransformerLayer layer([&] {
      auto made = TransformerLayerOptions(kH, kF, 4)
                      .mlp_activations({"gelu"})
                      .hidden_dropout(0)
                      .intermediate_dropout(0);
      made.self_attention().enable_sequence_parallel(c.sequence_parallel);
      made.self_attention().attention().attention_dropout(0);
      return made;
    }());
    const LogicalAxes act = {"batch", c.sequence_parallel ? "seqlen_tp" : "seqlen", "hidden"};
    const auto layout = placements_for(*resolve_logical_axes(act), mesh);
    const at::Tensor global = test::seeded_integers({kB, kS, kH}, 3).to(at::kFloat) / 7;
    at::Tensor local = piece_of(global, mesh, layout, rank).requires_grad_(true);
    DTensor x = DTensor::from_local(local, mesh, layout, std::vector<int64_t>{kB, kS, kH});

    CommTrace forward;
    DTensor y = layer(x);
    expect_plan(forward, c.forward, c.axis, c.name + " forward");
    ASSERT_EQ(y.placements(), layout);

    CommTrace backward;
    const at::Tensor grad = test::seeded_integers({kB, kS, kH}, 4).to(at::kFloat) / 5;
    {
      std::optional<GradientBuckets> buckets;
      if (c.bucketed) buckets.emplace();
      torch::autograd::backward({y.to_local()}, {piece_of(grad, mesh, layout, rank)});
      if (buckets) buckets->finish();
    }
    expect_plan(backward, c.backward, c.axis, c.name + " backward");
  });
  set_warning_handler(nullptr);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, TransformerPlan,
    ::testing::Values(
        // Megatron: the attention and MLP outputs are all-reduced forward; the inputs of their
        // column-parallel projections are all-reduced backward.
        PlanCase{"TP2", "tp=tp", "tp", false, Plan{2, 2 * kActivation, 0, 0, 0, 0},
                 Plan{2, 2 * kActivation, 0, 0, 0, 0}},
        // Megatron-SP: each all-reduce becomes an all-gather before the block and a
        // reduce-scatter after it, of the same bytes, both ways; the norms, now applied to
        // sequence shards, all-reduce their gradients.
        PlanCase{"TP2SP", "tpsp=tp", "tp", true, Plan{0, 0, 2, 2 * kActivation, 2, 2 * kActivation},
                 Plan{4, kNorms, 2, 2 * kActivation, 2, 2 * kActivation}},
        // FSDP: every kernel is all-gathered for use (and freed: gathered again in backward)
        // and its gradient reduce-scattered; the replicated norms all-reduce their gradients as
        // in data parallelism.
        PlanCase{"FSDP2", "fsdp=fsdp", "fsdp", false, Plan{0, 0, 4, kKernels, 0, 0},
                 Plan{4, kNorms, 4, kKernels, 4, kKernels}},
        // Data parallel: nothing forward; every parameter's gradient all-reduced, once.
        PlanCase{"DP2", "dp=data", "data", false, Plan{}, Plan{8, kKernels + kNorms, 0, 0, 0, 0}},
        // With GradientBuckets the same bytes go in one bucketed all-reduce.
        PlanCase{"DP2Bucketed", "dp=data", "data", false, Plan{},
                 Plan{1, kKernels + kNorms, 0, 0, 0, 0}, true},
        PlanCase{"FSDP2Bucketed", "fsdp=fsdp", "fsdp", false, Plan{0, 0, 4, kKernels, 0, 0},
                 Plan{1, kNorms, 4, kKernels, 4, kKernels}, true}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace te::nn
