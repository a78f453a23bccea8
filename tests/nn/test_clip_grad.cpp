// te::optim::grad_norm and clip_grad_norm on every layout of the equivalence matrix: the norm of
// the whole gradient and the clipped gradients equal one process's (LibTorch's own
// clip_grad_norm_ over the whole model), on every rank; where parameters are sharded, LibTorch's
// clip_grad_norm_ over a rank's local pieces gives another norm (the bug these functions avoid).

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>

#include <cmath>
#include <limits>
#include <map>

#include "../distributed/dist_test_util.h"
#include "../expect_error.h"
#include "matrix_layouts.h"
#include "te/nn.h"
#include "te/optim/clip_grad.h"

namespace te::nn {
namespace {

using test::piece_of;

constexpr double kMaxNorm = 0.05;  // below every case's norm: the gradients are scaled

TransformerLayer make_layer(bool sequence_parallel) {
  auto options =
      TransformerLayerOptions(16, 24, 4).hidden_dropout(0).intermediate_dropout(0).mlp_activations(
          {"swiglu"});
  options.self_attention().enable_sequence_parallel(sequence_parallel);
  options.self_attention().attention().attn_mask_type("causal").attention_dropout(0);
  return TransformerLayer(options);
}

at::Tensor global_input() { return test::seeded_integers({4, 6, 16}, 31).to(at::kFloat) / 7.0; }
at::Tensor output_weight() { return test::seeded_integers({4, 6, 16}, 32).to(at::kFloat) / 5.0; }

std::vector<at::Tensor> grads_of(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.grad().clone());
  return out;
}

// One process: the whole gradient, its 2-, 1- and inf-norms (LibTorch sums them in float32: held
// to 1e-6 relative; te sums in float64), and the gradients LibTorch's clip_grad_norm_ leaves.
struct Reference {
  double norm2 = 0, norm1 = 0, norm_inf = 0;
  std::map<std::string, at::Tensor> clipped;
};

Reference reference() {
  manual_seed(21);
  TransformerLayer layer = make_layer(false);
  (layer(global_input()) * output_weight()).sum().backward();
  Reference r;
  double sum1 = 0, max = 0;
  for (const auto& p : layer->parameters()) {
    sum1 += p.grad().abs().sum().item<double>();
    max = std::max(max, p.grad().abs().max().item<double>());
  }
  r.norm1 = sum1;
  r.norm_inf = max;
  r.norm2 = torch::nn::utils::clip_grad_norm_(layer->parameters(), kMaxNorm);
  for (const auto& p : layer->named_parameters()) r.clipped[p.key()] = p.value().grad().clone();
  return r;
}

TEST(ClipGradNorm, OneProcessIsLibTorchs) {
  const Reference ref = reference();
  manual_seed(21);
  TransformerLayer layer = make_layer(false);
  (layer(global_input()) * output_weight()).sum().backward();
  EXPECT_NEAR(te::optim::grad_norm(*layer, 1.0), ref.norm1, 1e-6 * ref.norm1);
  EXPECT_NEAR(te::optim::grad_norm(*layer, std::numeric_limits<double>::infinity()), ref.norm_inf,
              1e-12);
  // Not clipped at a large enough max_norm; clipped as LibTorch clips below it.
  const std::vector<at::Tensor> before = grads_of(*layer);
  EXPECT_NEAR(te::optim::clip_grad_norm(*layer, 1e9), ref.norm2, 1e-6 * ref.norm2);
  const std::vector<at::Tensor> after = grads_of(*layer);
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(before[i], after[i]));
  EXPECT_NEAR(te::optim::clip_grad_norm(*layer, kMaxNorm), ref.norm2, 1e-6 * ref.norm2);
  for (const auto& p : layer->named_parameters()) {
    EXPECT_TRUE(at::allclose(p.value().grad(), ref.clipped.at(p.key()), 1e-6, 1e-9)) << p.key();
  }
  EXPECT_NEAR(te::optim::grad_norm(*layer), kMaxNorm, 1e-6);
}

TEST(ClipGradNorm, BadInputIsNamedAndChangesNothing) {
  manual_seed(21);
  TransformerLayer layer = make_layer(false);
  (layer(global_input()) * output_weight()).sum().backward();
  const std::vector<at::Tensor> before = grads_of(*layer);
  EXPECT_ERROR(te::optim::clip_grad_norm(*layer, 0.0),
               "clip_grad_norm: max_norm 0 is not positive");
  EXPECT_ERROR(te::optim::grad_norm(*layer, -1.0), "grad_norm: norm_type -1 is not positive");
  // A non-finite gradient: its norm returned, nothing scaled, or te::Error when asked.
  layer->parameters()[0].mutable_grad().view(-1)[0] = std::nan("");
  const std::vector<at::Tensor> with_nan = grads_of(*layer);
  EXPECT_TRUE(std::isnan(te::optim::clip_grad_norm(*layer, kMaxNorm)));
  EXPECT_ERROR(te::optim::clip_grad_norm(*layer, kMaxNorm, 2.0, /*error_if_nonfinite=*/true),
               "clip_grad_norm: the gradient's 2-norm is nan; a gradient holds inf or nan");
  const std::vector<at::Tensor> after = grads_of(*layer);
  for (std::size_t i = 1; i < before.size(); ++i) EXPECT_TRUE(at::equal(before[i], after[i]));
}

class ClipGradNormLayouts : public ::testing::TestWithParam<test::MatrixLayout> {};

TEST_P(ClipGradNormLayouts, NormAndClippedGradientsAreOneProcesss) {
  const test::MatrixLayout& layout = GetParam();
  const Reference ref = reference();
  set_warning_handler([](std::string_view) {});
  int64_t world = 1;
  for (int64_t s : layout.shape) world *= s;
  run_local_ranks(static_cast<int>(world), [&](int rank) {
    DeviceMesh mesh(layout.shape, layout.axes);
    MeshScope mesh_scope(mesh);
    MeshResourceScope resource_scope(parse_mesh_resource(layout.mesh_resource));
    manual_seed(21);
    TransformerLayer layer = make_layer(layout.sequence_parallel);
    const LogicalAxes in_axes = {"batch", layout.sequence_parallel ? "seqlen_tp" : "seqlen",
                                 "hidden"};
    const auto in_placements = placements_for(*resolve_logical_axes(in_axes), mesh);
    const DTensor x = DTensor::from_local(piece_of(global_input(), mesh, in_placements, rank), mesh,
                                          in_placements, std::vector<int64_t>{4, 6, 16});
    {
      GradientBuckets buckets;
      (layer(x).full_tensor() * output_weight()).sum().backward();
      buckets.finish();
    }
    // LibTorch's over this rank's pieces: another norm wherever some parameter is sharded.
    const bool sharded =
        layer->is_sharded() || layer->mlp->is_sharded() || layer->self_attention->is_sharded();
    double local_sum = 0;
    for (const auto& p : layer->parameters()) local_sum += p.grad().pow(2).sum().item<double>();
    if (sharded) {
      EXPECT_GT(std::abs(std::sqrt(local_sum) - ref.norm2), 1e-4 * ref.norm2) << "rank " << rank;
    }
    EXPECT_NEAR(te::optim::grad_norm(*layer, 1.0), ref.norm1, 1e-5 * ref.norm1) << rank;
    EXPECT_NEAR(te::optim::grad_norm(*layer, std::numeric_limits<double>::infinity()), ref.norm_inf,
                1e-5 * ref.norm_inf)
        << rank;
    EXPECT_NEAR(te::optim::clip_grad_norm(*layer, kMaxNorm), ref.norm2, 1e-5 * ref.norm2)
        << "rank " << rank;
    const auto layouts = named_parameter_layouts(*layer);
    for (const auto& p : layer->named_parameters()) {
      const ParameterLayout& pl = layouts.at(p.key());
      const at::Tensor want = pl.mesh ? piece_of(ref.clipped.at(p.key()), mesh, pl.placements, rank)
                                      : ref.clipped.at(p.key());
      EXPECT_TRUE(at::allclose(p.value().grad(), want, 1e-4, 1e-7))
          << p.key() << " on rank " << rank;
    }
  });
  set_warning_handler(nullptr);
}

INSTANTIATE_TEST_SUITE_P(Layouts, ClipGradNormLayouts, ::testing::ValuesIn(test::matrix_layouts()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace te::nn
