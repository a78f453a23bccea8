// FP8 training steps on Gloo ranks against one process: the same outputs, weights and FP8 scales
// (within 1e-5), scales identical on every rank, one fused amax all-reduce per direction, and
// the pipeline axis left out of the reduction.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ThreadLocalState.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "../distributed/dist_test_util.h"
#include "../expect_error.h"
#include "te/fp8.h"
#include "te/nn.h"

namespace te::nn {
namespace {

using test::piece_of;

constexpr int kSteps = 3;
constexpr double kLr = 0.05;
const std::vector<int64_t> kShape = {4, 6, 32};

fp8::DelayedScaling recipe() {
  fp8::DelayedScaling r;
  r.amax_history_len = 4;
  return r;
}

LayerNormMLP make_mlp() {
  manual_seed(31);
  return LayerNormMLP(
      LayerNormMLPOptions(32, 64).activations({"gelu"}).intermediate_dropout_rate(0));
}

// The same MLP, its parameters sharded as TE's table maps `resource` onto the current mesh.
LayerNormMLP make_mlp(const MeshResource& resource) {
  MeshResourceScope scope(resource);
  return make_mlp();
}

at::Tensor input(int step) { return test::seeded_integers(kShape, 40 + step).to(at::kFloat) / 7.0; }
at::Tensor output_weight(int step) {
  return test::seeded_integers(kShape, 60 + step).to(at::kFloat) / 50.0;
}

// After each step: the output, every parameter and every FP8 buffer.
struct Snapshot {
  at::Tensor y;
  std::map<std::string, at::Tensor> params, buffers;
};

void sgd(torch::nn::Module& m) {
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters()) {
    p.sub_(p.grad() * kLr);
    p.mutable_grad() = at::Tensor();
  }
}

std::vector<Snapshot> one_process() {
  LayerNormMLP mlp = make_mlp();
  std::vector<Snapshot> out;
  for (int step = 0; step < kSteps; ++step) {
    Snapshot s;
    {
      Fp8Autocast fp8(true, recipe());
      at::Tensor y = mlp(input(step));
      (y * output_weight(step)).sum().backward();
      s.y = y.detach();
    }
    sgd(*mlp);
    for (const auto& p : mlp->named_parameters()) s.params[p.key()] = p.value().detach().clone();
    for (const auto& b : mlp->named_buffers()) s.buffers[b.key()] = b.value().clone();
    out.push_back(s);
  }
  return out;
}

struct Layout {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> axes;
  std::string mesh_resource;
  std::string reduced_axis;  // the group the amax all-reduce runs over
};

void PrintTo(const Layout& layout, std::ostream* os) { *os << layout.name; }

class Fp8Parallel : public ::testing::TestWithParam<Layout> {};

TEST_P(Fp8Parallel, TrainingStepsMatchOneProcessWithIdenticalScalesOnEveryRank) {
  const Layout& layout = GetParam();
  const std::vector<Snapshot> ref = one_process();
  set_warning_handler([](std::string_view) {});
  int64_t world = 1;
  for (int64_t s : layout.shape) world *= s;
  std::mutex mu;
  std::vector<std::map<std::string, at::Tensor>> rank_buffers(static_cast<std::size_t>(world));
  run_local_ranks(static_cast<int>(world), [&](int rank) {
    DeviceMesh mesh(layout.shape, layout.axes);
    MeshScope mesh_scope(mesh);
    const MeshResource resource = parse_mesh_resource(layout.mesh_resource);
    LayerNormMLP mlp = make_mlp(resource);
    const auto layouts = named_parameter_layouts(*mlp);
    for (int step = 0; step < kSteps; ++step) {
      CommTrace trace;
      std::optional<Fp8Autocast> fp8;
      fp8.emplace(true, recipe(), resource);  // opens the MeshResource too
      const auto in_placements =
          placements_for(*resolve_logical_axes({"batch", "seqlen", "hidden"}), mesh);
      const DTensor x = DTensor::from_local(piece_of(input(step), mesh, in_placements, rank), mesh,
                                            in_placements, kShape);
      const DTensor y = mlp(x);
      const at::Tensor y_full = y.full_tensor();
      ASSERT_TRUE(at::allclose(y_full, ref[step].y, 1e-5, 1e-5))
          << "step " << step << " rank " << rank << " max err "
          << (y_full - ref[step].y).abs().max().item<double>();
      // Backward: exactly one amax all-reduce of both GEMMs' gradient amaxes (2 floats).
      trace.clear();
      (y_full * output_weight(step)).sum().backward();
      int64_t amax_reductions = 0;
      for (const CommRecord& r : trace.records()) {
        amax_reductions +=
            r.kind == Collective::kAllReduce && r.bytes == 8 && r.mesh_axis == layout.reduced_axis;
      }
      EXPECT_EQ(amax_reductions, 1) << trace.table();
      // Forward: at the region's end, one all-reduce of 2 GEMMs x (input, kernel) amaxes.
      trace.clear();
      fp8.reset();
      ASSERT_EQ(trace.total_count(), 1) << trace.table();
      EXPECT_EQ(trace.records()[0].bytes, 16);
      EXPECT_EQ(trace.records()[0].mesh_axis, layout.reduced_axis);
      sgd(*mlp);
      for (const auto& p : mlp->named_parameters()) {
        const ParameterLayout& pl = layouts.at(p.key());
        const at::Tensor want =
            pl.mesh ? piece_of(ref[step].params.at(p.key()), mesh, pl.placements, rank)
                    : ref[step].params.at(p.key());
        EXPECT_TRUE(at::allclose(p.value(), want, 1e-5, 1e-5))
            << p.key() << " step " << step << " rank " << rank;
      }
      for (const auto& b : mlp->named_buffers()) {
        EXPECT_TRUE(at::allclose(b.value(), ref[step].buffers.at(b.key()), 1e-5, 0))
            << b.key() << " step " << step << " rank " << rank;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& b : mlp->named_buffers()) {
      rank_buffers[static_cast<std::size_t>(rank)][b.key()] = b.value().clone();
    }
  });
  set_warning_handler(nullptr);
  for (int64_t r = 1; r < world; ++r) {
    for (const auto& [name, value] : rank_buffers[0]) {
      EXPECT_TRUE(at::equal(rank_buffers[static_cast<std::size_t>(r)].at(name), value))
          << name << " differs between rank 0 and rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, Fp8Parallel,
    ::testing::Values(Layout{"DP2", {2}, {"data"}, "dp=data", "data"},
                      Layout{"TP2", {2}, {"tp"}, "tp=tp", "tp"},
                      Layout{"FSDP2", {2}, {"fsdp"}, "fsdp=fsdp", "fsdp"},
                      Layout{"DP2xTP2", {2, 2}, {"data", "tp"}, "dp=data,tp=tp", "data+tp"}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

// One step of the MLP `build` makes, under `recipe`, on one process and then on DP2, TP2, TP2 with
// sequence parallelism, FSDP2 and DP2xTP2 (Gloo ranks, TE's table): every rank's output, input
// gradient and weight gradients equal one process's, within fp32 rounding or, with `flips` > 0,
// within `flips` of each tensor's largest magnitude: the room a few FP8 codes flipped by one-ulp
// differences before a cast take.
void expect_layouts_equal_one_process(const std::function<LayerNormMLP()>& build,
                                      const fp8::Recipe& recipe, const at::Tensor& x0,
                                      const at::Tensor& wy, double flips = 0.0,
                                      bool fp8_weights = false) {
  // fp32 sums in another order: 1e-5 relative, and absolute 1e-6 of the largest magnitude.
  auto close = [flips](const at::Tensor& got, const at::Tensor& want) {
    const double top = want.abs().max().item<double>();
    return at::allclose(got, want, 1e-5, std::max(1e-6 * top, flips * top) + 1e-7);
  };
  const std::vector<int64_t> shape = x0.sizes().vec();
  at::Tensor want, want_grad;
  std::map<std::string, at::Tensor> want_param_grads;
  {
    LayerNormMLP mlp = build();
    if (fp8_weights) quantize_fp8_weights(*mlp, recipe);
    Fp8Autocast fp8(true, recipe);
    const at::Tensor x = x0.clone().requires_grad_(true);
    want = mlp(x);
    (want * wy).sum().backward();
    want = want.detach();
    want_grad = x.grad();
    for (const auto& p : mlp->named_parameters()) want_param_grads[p.key()] = p.value().grad();
  }
  set_warning_handler([](std::string_view) {});
  struct MeshLayout {
    std::vector<int64_t> shape;
    std::vector<std::string> axes;
    const char* spec;
  };
  const std::vector<MeshLayout> meshes = {{{2}, {"data"}, "dp=data"},
                                          {{2}, {"data"}, "tp=data"},
                                          {{2}, {"data"}, "tpsp=data"},
                                          {{2}, {"data"}, "fsdp=data"},
                                          {{2, 2}, {"data", "model"}, "dp=data,tp=model"}};
  for (const MeshLayout& layout : meshes) {
    const char* spec = layout.spec;
    int64_t world = 1;
    for (const int64_t n : layout.shape) world *= n;
    run_local_ranks(static_cast<int>(world), [&](int rank) {
      DeviceMesh mesh(layout.shape, layout.axes);
      MeshScope mesh_scope(mesh);
      const MeshResource resource = parse_mesh_resource(spec);
      LayerNormMLP built = [&] {
        MeshResourceScope scope(resource);
        return build();
      }();
      if (fp8_weights) EXPECT_EQ(quantize_fp8_weights(*built, recipe), 2);
      Fp8Autocast fp8(true, recipe, resource);
      const auto placements =
          placements_for(*resolve_logical_axes({"batch", "seqlen", "hidden"}), mesh);
      at::Tensor x_local = piece_of(x0, mesh, placements, rank).requires_grad_(true);
      const DTensor y = built(DTensor::from_local(x_local, mesh, placements, shape));
      const at::Tensor y_full = y.full_tensor();
      EXPECT_TRUE(close(y_full, want))
          << spec << " rank " << rank << " max err " << (y_full - want).abs().max().item<double>();
      (y_full * wy).sum().backward();
      if (fp8_weights) {
        // The GEMMs took the held codes on this layout: a master changed since is refused.
        {
          at::NoGradGuard no_grad;
          built->wo_kernel.mul_(1.0);
        }
        EXPECT_ERROR(built(DTensor::from_local(x_local.detach(), mesh, placements, shape)),
                     "wo_kernel' changed since its FP8 codes were cast");
      }
      const at::Tensor g = piece_of(want_grad, mesh, placements, rank);
      EXPECT_TRUE(close(x_local.grad(), g)) << spec << " rank " << rank << " max err "
                                            << (x_local.grad() - g).abs().max().item<double>();
      // The weight gradients: their GEMMs contract over the tokens, which DP splits.
      const auto layouts = named_parameter_layouts(*built);
      for (const auto& p : built->named_parameters()) {
        const ParameterLayout& pl = layouts.at(p.key());
        const at::Tensor& full = want_param_grads.at(p.key());
        const at::Tensor w = pl.mesh ? piece_of(full, mesh, pl.placements, rank) : full;
        ASSERT_TRUE(p.value().grad().defined()) << p.key();
        EXPECT_TRUE(close(p.value().grad(), w))
            << spec << " rank " << rank << " " << p.key() << " max err "
            << (p.value().grad() - w).abs().max().item<double>() << " of "
            << w.abs().max().item<double>();
      }
    });
  }
  set_warning_handler(nullptr);
}

TEST(Fp8Parallel, CurrentScalingCastsWithTheWholeTensorsAmaxOnEveryLayout) {
  // Each rank holds a piece; the amax (and so the scale) must be the whole tensor's.
  expect_layouts_equal_one_process([] { return make_mlp(); }, fp8::CurrentScaling{}, input(0),
                                   output_weight(0));
}

// FP8 weights in training: each rank holds its piece of every kernel's codes, cast with the whole
// kernel's amax (reduced over the ranks holding pieces); the GEMMs take them where one process
// takes its whole codes (FSDP gathers them), and the gradients reach the fp32 masters' pieces.
TEST(Fp8Parallel, HeldFp8WeightsEqualOneProcessOnEveryLayout) {
  expect_layouts_equal_one_process([] { return make_mlp(); }, fp8::CurrentScaling{}, input(0),
                                   output_weight(0), 0.0, /*fp8_weights=*/true);
}

// Float8BlockScaling keeps no state and reduces nothing: each rank scales its own blocks, which
// are one process's where every shard boundary falls on a block boundary (here 128 tokens per
// data-parallel rank, and 256 hidden and 512 MLP features, whose halves are whole tiles under
// TP). (FP32 scales: with power-of-two ones a block cut elsewhere would mostly land on the same
// scale and go unseen; with 200 MLP features TP2 is 0.02-0.06 off, with 100 tokens per rank DP2's
// weight gradients are. Normal inputs: small integers repeat a block's amax in any block. With
// them a few values sit within an fp32 ulp of an FP8 rounding boundary, and LibTorch 2.6's
// LayerNorm on a piece can differ from one on the whole by that ulp: a flipped code, 3e-4 of the
// magnitude here, which `flips` = 2e-3 leaves room for, and a cut block does not.)
TEST(Fp8Parallel, BlockScalingEqualsOneProcessWhereShardsFallOnBlocks) {
  const std::vector<int64_t> shape = {2, 128, 256};
  expect_layouts_equal_one_process(
      [] {
        manual_seed(37);
        return LayerNormMLP(
            LayerNormMLPOptions(256, 512).activations({"gelu"}).intermediate_dropout_rate(0));
      },
      fp8::Float8BlockScaling{fp8::Format::kHybrid, /*power_2_scales=*/false, 0.0f},
      at::randn(shape, at::detail::createCPUGenerator(71)),
      at::randn(shape, at::detail::createCPUGenerator(72)) * 0.1, /*flips=*/2e-3);
}

// MXFP8 likewise: 1x32 blocks, which every shard boundary here (128 tokens per data-parallel rank,
// halves of 256 and 512 features under TP) falls between; HYBRID, so the gradients are E5M2.
TEST(Fp8Parallel, Mxfp8EqualsOneProcessWhereShardsFallOnBlocks) {
  const std::vector<int64_t> shape = {2, 128, 256};
  expect_layouts_equal_one_process(
      [] {
        manual_seed(38);
        return LayerNormMLP(
            LayerNormMLPOptions(256, 512).activations({"gelu"}).intermediate_dropout_rate(0));
      },
      fp8::MXFP8BlockScaling{fp8::Format::kHybrid},
      at::randn(shape, at::detail::createCPUGenerator(73)),
      at::randn(shape, at::detail::createCPUGenerator(74)) * 0.1, /*flips=*/2e-3);
}

// NVFP4 likewise (stochastic rounding off: its draws are each rank's own): 1x16 blocks and 16x16
// weight tiles between every shard boundary, the wgrad operands' Hadamard blocks of 16 tokens
// inside each data-parallel rank's 128, and every cast's tensor amax reduced over the mesh, so a
// rank's piece takes the whole tensor's second-level scale.
TEST(Fp8Parallel, Nvfp4EqualsOneProcessWhereShardsFallOnBlocks) {
  const std::vector<int64_t> shape = {2, 128, 256};
  fp8::NVFP4BlockScaling recipe;
  recipe.disable_stochastic_rounding = true;
  expect_layouts_equal_one_process(
      [] {
        manual_seed(39);
        return LayerNormMLP(
            LayerNormMLPOptions(256, 512).activations({"gelu"}).intermediate_dropout_rate(0));
      },
      recipe, at::randn(shape, at::detail::createCPUGenerator(75)),
      at::randn(shape, at::detail::createCPUGenerator(76)) * 0.1, /*flips=*/2e-3);
}

TEST(Fp8Parallel, ThePipelineAxisIsLeftOutOfTheAmaxReduction) {
  // Two pipeline rows see different data: each keeps its own scales, agreed within its row.
  std::vector<float> scales(4);
  run_local_ranks(4, [&](int rank) {
    DeviceMesh mesh({2, 2}, {"pipe", "data"});
    MeshScope mesh_scope(mesh);
    MeshResource resource;
    resource.pp = "pipe";
    resource.dp = "data";
    manual_seed(3);
    Dense dense(8, 8);
    {
      Fp8Autocast fp8(true, recipe(), resource);
      const at::Tensor x = at::full({2, 8}, 1.0f + rank);  // amax 1 + rank
      fp8::linear(x, dense->kernel, dense->fp8_meta);
    }
    scales[static_cast<std::size_t>(rank)] = dense->fp8_meta->fwd_scale[0].item<float>();
  });
  // Ranks 0, 1 (pipe 0) reduce to amax 2; ranks 2, 3 (pipe 1) to amax 4.
  EXPECT_EQ(scales[0], 224.0f);
  EXPECT_EQ(scales[1], 224.0f);
  EXPECT_EQ(scales[2], 112.0f);
  EXPECT_EQ(scales[3], 112.0f);
}

// LibTorch runs the backward of CUDA tensors on a thread of its own per device, handing it the
// caller's at::ThreadLocalState, not te's thread-local scopes. Here exactly that: each rank
// thread (A) builds the step with its scopes open (GradientBuckets, CommTrace, an FP8 region),
// and another thread (B) runs backward() under A's at::ThreadLocalStateGuard. Deferred gradients,
// the trace (backward collectives and the FP8 amax reduction included), every gradient and the
// FP8 scales must be those of the same step with backward on A. (Before the scopes were lent to
// backward, B bucketed nothing and its collectives were missing from A's trace.)
struct BackwardSeen {
  int64_t pending = 0;
  std::string trace;
  std::map<std::string, at::Tensor> grads, buffers;
};

BackwardSeen step_with_backward_on(bool other_thread, const char* spec, int rank) {
  DeviceMesh mesh({2}, {"data"});
  MeshScope mesh_scope(mesh);
  const MeshResource resource = parse_mesh_resource(spec);
  LayerNormMLP mlp = make_mlp(resource);
  BackwardSeen seen;
  CommTrace trace;
  GradientBuckets buckets;
  {
    Fp8Autocast fp8(true, recipe(), resource);
    const auto placements =
        placements_for(*resolve_logical_axes({"batch", "seqlen", "hidden"}), mesh);
    const DTensor x =
        DTensor::from_local(piece_of(input(0), mesh, placements, rank), mesh, placements, kShape);
    const at::Tensor loss =
        (mlp(x).to_local() * piece_of(output_weight(0), mesh, placements, rank)).sum();
    if (other_thread) {
      const at::ThreadLocalState state;  // what the engine hands its device threads
      std::exception_ptr failed;
      std::thread([&] {
        try {
          const at::ThreadLocalStateGuard guard(state);
          loss.backward();
        } catch (...) {
          failed = std::current_exception();
        }
      }).join();
      if (failed) std::rethrow_exception(failed);
    } else {
      loss.backward();
    }
    seen.pending = buckets.pending();
  }
  buckets.finish();
  seen.trace = trace.table();
  for (const auto& p : mlp->named_parameters()) seen.grads[p.key()] = p.value().grad().clone();
  for (const auto& b : mlp->named_buffers()) seen.buffers[b.key()] = b.value().clone();
  return seen;
}

TEST(Fp8Parallel, BackwardOnAnotherThreadUnderTheCallersStateSeesTheCallersScopes) {
  set_warning_handler([](std::string_view) {});
  for (const char* spec : {"dp=data", "fsdp=data"}) {
    run_local_ranks(2, [&](int rank) {
      const BackwardSeen here = step_with_backward_on(false, spec, rank);
      const BackwardSeen there = step_with_backward_on(true, spec, rank);
      if (std::string(spec) == "dp=data") EXPECT_GT(here.pending, 0) << spec;
      EXPECT_EQ(there.pending, here.pending) << spec;
      EXPECT_EQ(there.trace, here.trace) << spec;
      EXPECT_NE(here.trace.find("all_reduce"), std::string::npos) << here.trace;
      for (const auto& [name, g] : here.grads) {
        EXPECT_TRUE(at::equal(there.grads.at(name), g)) << spec << " gradient of " << name;
      }
      for (const auto& [name, b] : here.buffers) {
        EXPECT_TRUE(at::equal(there.buffers.at(name), b)) << spec << " " << name;
      }
    });
  }
  set_warning_handler(nullptr);
}

}  // namespace
}  // namespace te::nn
