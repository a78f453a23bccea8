// Gradient accumulation on a mesh: N micro-batches' backward passes inside one GradientBuckets
// scope, the data-parallel all-reduces run once at finish() (as many as one batch's), give the
// gradients of one big batch on one process.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>

#include "../distributed/dist_test_util.h"
#include "te/nn.h"

namespace te::nn {
namespace {

using test::piece_of;

TransformerLayer make_layer() {
  auto options = TransformerLayerOptions(16, 24, 4).hidden_dropout(0).intermediate_dropout(0);
  options.self_attention().attention().attn_mask_type("causal").attention_dropout(0);
  return TransformerLayer(options);
}

at::Tensor global_input() { return test::seeded_integers({8, 6, 16}, 41).to(at::kFloat) / 7.0; }
at::Tensor output_weight() { return test::seeded_integers({8, 6, 16}, 42).to(at::kFloat) / 5.0; }

TEST(GradientAccumulationParallel, MicroBatchesReduceOnceAndEqualOneBigBatch) {
  manual_seed(21);
  TransformerLayer one = make_layer();
  (one(global_input()) * output_weight()).sum().backward();
  std::map<std::string, at::Tensor> want;
  for (const auto& p : one->named_parameters()) want[p.key()] = p.value().grad();

  for (const std::string resource : {"dp=data", "dp=data,tp=tp"}) {
    const bool tp = resource.find("tp=") != std::string::npos;
    run_local_ranks(tp ? 4 : 2, [&](int rank) {
      DeviceMesh mesh(
          tp ? std::vector<int64_t>{2, 2} : std::vector<int64_t>{2},
          tp ? std::vector<std::string>{"data", "tp"} : std::vector<std::string>{"data"});
      MeshScope mesh_scope(mesh);
      MeshResourceScope resource_scope(parse_mesh_resource(resource));
      manual_seed(21);
      TransformerLayer layer = make_layer();
      std::vector<Placement> in = {Shard{0}};
      if (tp) in.push_back(Replicate{});
      auto backward = [&](int64_t first, int64_t rows) {
        const at::Tensor x = global_input().narrow(0, first, rows);
        const DTensor dx = DTensor::from_local(piece_of(x, mesh, in, rank), mesh, in,
                                               std::vector<int64_t>{rows, 6, 16});
        (layer(dx).full_tensor() * output_weight().narrow(0, first, rows)).sum().backward();
      };
      // One batch of 8: the all-reduces finish() runs.
      int64_t one_batch = 0;
      {
        GradientBuckets buckets;
        backward(0, 8);
        CommTrace trace;
        buckets.finish();
        one_batch = trace.count(Collective::kAllReduce, "data");
      }
      EXPECT_GT(one_batch, 0);
      for (auto& p : layer->parameters()) p.mutable_grad() = at::Tensor();
      // Four micro-batches of 2: nothing reduced over the data axis until finish(), then as many
      // all-reduces as one batch.
      GradientBuckets buckets;
      CommTrace during;
      for (int64_t m = 0; m < 4; ++m) backward(2 * m, 2);
      EXPECT_EQ(during.count(Collective::kAllReduce, "data"), 0) << resource;
      CommTrace at_finish;
      buckets.finish();
      EXPECT_EQ(at_finish.count(Collective::kAllReduce, "data"), one_batch) << resource;
      const auto layouts = named_parameter_layouts(*layer);
      for (const auto& p : layer->named_parameters()) {
        const ParameterLayout& pl = layouts.at(p.key());
        const at::Tensor expected =
            pl.mesh ? piece_of(want.at(p.key()), mesh, pl.placements, rank) : want.at(p.key());
        EXPECT_TRUE(at::allclose(p.value().grad(), expected, 1e-4, 1e-5))
            << p.key() << " under " << resource << " on rank " << rank;
      }
    });
  }
}

}  // namespace
}  // namespace te::nn
