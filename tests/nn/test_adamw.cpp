// te::optim::AdamW: torch.optim.AdamW's numbers (known answers of torch 2.11), fp32 masters that
// make a bf16 run update exactly as an fp32 one and hold the bf16 weights at the masters rounded,
// the weight-decay groups on te's parameter names, bad options named, every layout of the
// equivalence matrix stepping like one process, and checkpoints of the state and the masters.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "../distributed/dist_test_util.h"
#include "../expect_error.h"
#include "../temp_dir.h"
#include "matrix_layouts.h"
#include "te/nn.h"
#include "te/optim/adamw.h"

namespace te::nn {
namespace {

using te::optim::AdamWOptions;
using test::piece_of;

// The known-answer case: p[i] = (i - 5) / 8 of shape [3, 4]; at step k (from 1) the gradient
// g[i] = ((7 i + 3 k) mod 11 - 5) / 8 (exact in bf16 and fp32); lr 0.05, betas (0.9, 0.99),
// eps 1e-3, six steps.
at::Tensor initial() { return (at::arange(12, at::kFloat) - 5).div(8).reshape({3, 4}); }
at::Tensor gradient(int64_t k) {
  return ((at::arange(12, at::kLong) * 7 + 3 * k).remainder(11) - 5)
      .to(at::kFloat)
      .div(8)
      .reshape({3, 4});
}
AdamWOptions known_options(double weight_decay) {
  return AdamWOptions(0.05).betas({0.9, 0.99}).eps(1e-3).weight_decay(weight_decay);
}

at::Tensor run_known(at::ScalarType dtype, double weight_decay, bool masters = true) {
  at::Tensor p = initial().to(dtype).requires_grad_(true);
  te::optim::AdamW opt({p}, known_options(weight_decay).master_weights(masters));
  for (int64_t k = 1; k <= 6; ++k) {
    p.mutable_grad() = gradient(k).to(dtype);
    opt.step();
  }
  return p.detach();
}

// torch 2.11.0 (CPU): torch.optim.AdamW([w], lr=0.05, betas=(0.9, 0.99), eps=1e-3,
// weight_decay=wd, foreach=False), w fp32, the same gradients; printed with "%.9g".
const std::vector<float> kTorchDecay01 = {
    -0.554861248f, -0.555600703f, -0.481434166f, -0.105281495f, -0.189804956f, 0.000944451429f,
    0.213931203f,  0.243383825f,  0.321380317f,  0.638384879f,  0.461241394f,  0.779400945f};
const std::vector<float> kTorchDecay0 = {
    -0.57212925f, -0.572117209f, -0.494680047f, -0.110536873f, -0.194713995f, 0.000646033324f,
    0.219789535f, 0.250255615f,  0.332681745f,  0.655839086f,  0.477114022f,  0.80287075f};

void expect_values(const at::Tensor& got, const std::vector<float>& want) {
  const at::Tensor flat = got.to(at::kFloat).reshape(-1);
  ASSERT_EQ(flat.numel(), static_cast<int64_t>(want.size()));
  for (int64_t i = 0; i < flat.numel(); ++i) {
    EXPECT_EQ(flat[i].item<float>(), want[static_cast<std::size_t>(i)]) << "element " << i;
  }
}

TEST(AdamW, Fp32IsTorchAdamW) {
  expect_values(run_known(at::kFloat, 0.1), kTorchDecay01);
  expect_values(run_known(at::kFloat, 0.0), kTorchDecay0);
  // LibTorch's own AdamW (mul_ + add_ for the first moment): within a few ulp.
  at::Tensor p = initial().requires_grad_(true);
  torch::optim::AdamW libtorch(
      {p}, torch::optim::AdamWOptions(0.05).betas({0.9, 0.99}).eps(1e-3).weight_decay(0.1));
  for (int64_t k = 1; k <= 6; ++k) {
    p.mutable_grad() = gradient(k);
    libtorch.step();
  }
  EXPECT_TRUE(at::allclose(p.detach(), run_known(at::kFloat, 0.1), 1e-6, 1e-7));
}

TEST(AdamW, Bf16WithMastersUpdatesAsFp32AndHoldsTheMastersRounded) {
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    at::Tensor p = initial().to(dtype).requires_grad_(true);
    te::optim::AdamW opt({p}, known_options(0.1));
    for (int64_t k = 1; k <= 6; ++k) {
      p.mutable_grad() = gradient(k).to(dtype);
      opt.step();
    }
    const te::optim::AdamWParamState* st = opt.state_of(p, /*create=*/false);
    ASSERT_NE(st, nullptr);
    ASSERT_TRUE(st->master().defined());
    EXPECT_EQ(st->master().scalar_type(), at::kFloat);
    EXPECT_EQ(st->exp_avg().scalar_type(), at::kFloat);
    EXPECT_EQ(st->step(), 6);
    expect_values(st->master(), kTorchDecay01);  // the initial values and gradients are exact
    EXPECT_TRUE(at::equal(p.detach(), st->master().to(dtype))) << dtype;
  }
  // Without masters the update runs in bf16 (torch's way): the weights drift from fp32's.
  const at::Tensor plain = run_known(at::kBFloat16, 0.1, /*masters=*/false);
  const at::Tensor want = at::tensor(kTorchDecay01).reshape({3, 4});
  EXPECT_FALSE(at::equal(plain, want.to(at::kBFloat16)));
  EXPECT_TRUE(at::allclose(plain.to(at::kFloat), want, 0, 0.05));
}

TEST(AdamW, GroupsAndTheScheduleSetTheirOwnLearningRates) {
  at::Tensor a = initial().requires_grad_(true), b = initial().requires_grad_(true);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{a});
  groups.emplace_back(std::vector<at::Tensor>{b},
                      std::make_unique<AdamWOptions>(known_options(0.1).lr(0)));
  te::optim::AdamW opt(std::move(groups), known_options(0.1));
  a.mutable_grad() = gradient(1);
  b.mutable_grad() = gradient(1);
  opt.step();
  EXPECT_FALSE(at::equal(a.detach(), initial()));
  EXPECT_TRUE(at::equal(b.detach(), initial()));  // lr 0 and decay x (1 - 0)
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].options().get_lr(), 0.0);
  opt.param_groups()[1].options().set_lr(0.5);
  EXPECT_DOUBLE_EQ(static_cast<AdamWOptions&>(opt.param_groups()[1].options()).lr(), 0.5);
}

TransformerLayer make_layer(bool sequence_parallel) {
  auto options =
      TransformerLayerOptions(16, 24, 4).hidden_dropout(0).intermediate_dropout(0).mlp_activations(
          {"swiglu"});
  options.self_attention().enable_sequence_parallel(sequence_parallel);
  options.self_attention().attention().attn_mask_type("causal").attention_dropout(0);
  options.self_attention().input_layernorm(true).use_bias(true);
  return TransformerLayer(options);
}

std::set<std::string> names_of(const torch::optim::OptimizerParamGroup& group,
                               const torch::nn::Module& m) {
  std::set<std::string> out;
  for (const auto& p : m.named_parameters()) {
    for (const auto& q : group.params()) {
      if (q.is_same(p.value())) out.insert(p.key());
    }
  }
  return out;
}

TEST(AdamW, WeightDecayGroupsLeaveNormsAndBiasesOut) {
  manual_seed(3);
  TransformerLayer layer = make_layer(false);
  const auto groups = te::optim::weight_decay_groups(*layer, AdamWOptions(1e-3).weight_decay(0.1));
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_DOUBLE_EQ(static_cast<const AdamWOptions&>(groups[0].options()).weight_decay(), 0.1);
  EXPECT_DOUBLE_EQ(static_cast<const AdamWOptions&>(groups[1].options()).weight_decay(), 0.0);
  EXPECT_DOUBLE_EQ(groups[1].options().get_lr(), 1e-3);
  const std::set<std::string> decayed = names_of(groups[0], *layer);
  const std::set<std::string> kept = names_of(groups[1], *layer);
  for (const std::string& name : decayed) {
    EXPECT_NE(name.find("kernel"), std::string::npos) << name << " is decayed";
  }
  for (const std::string& name : kept) {
    const bool norm_or_bias =
        name.find("bias") != std::string::npos || name.find("scale") != std::string::npos;
    EXPECT_TRUE(norm_or_bias) << name << " is kept out of decay";
  }
  EXPECT_TRUE(kept.count("self_attention.qkv_bias"));  // 2-D, named *bias
  EXPECT_EQ(decayed.size() + kept.size(), layer->parameters().size());
  // A rule of one's own; an empty group is left out.
  const auto all = te::optim::weight_decay_groups(
      *layer, {}, [](const std::string&, const std::vector<int64_t>&) { return false; });
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(all[0].params().size(), layer->parameters().size());
}

TEST(AdamW, BadInputIsNamedAndChangesNothing) {
  at::Tensor p = initial().requires_grad_(true);
  EXPECT_ERROR(te::optim::AdamW({p}, AdamWOptions(-1)), "AdamW: lr -1 is negative");
  EXPECT_ERROR(te::optim::AdamW({p}, AdamWOptions(1).betas({0.9, 1.0})),
               "AdamW: beta2 1 is outside [0, 1)");
  EXPECT_ERROR(te::optim::AdamW({p}, AdamWOptions(1).eps(-1)), "AdamW: eps -1 is negative");
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p},
                      std::make_unique<torch::optim::AdamWOptions>(1e-3));
  EXPECT_ERROR(te::optim::AdamW(std::move(groups)),
               "AdamW: parameter group 0 has another optimizer's options");
  std::vector<torch::optim::OptimizerParamGroup> bad_group;
  bad_group.emplace_back(std::vector<at::Tensor>{p},
                         std::make_unique<AdamWOptions>(AdamWOptions(1).weight_decay(-2)));
  EXPECT_ERROR(te::optim::AdamW(std::move(bad_group)),
               "AdamW: weight_decay -2 (parameter group 0) is negative");
  EXPECT_ERROR(te::optim::AdamW(*make_layer(false), AdamWOptions().weight_decay(-0.1)),
               "AdamW: weight_decay -0.1 is negative");

  EXPECT_ERROR(te::optim::AdamW(std::vector<at::Tensor>{p, p}),
               "AdamW: a parameter of shape [3, 4] is in parameter group 0 and again in group 0");
  te::optim::AdamW opt({p}, known_options(0.1));
  p.mutable_grad() = gradient(1).to(at::kDouble);
  EXPECT_ERROR(opt.step(), "AdamW: a Double gradient for a Float parameter [3, 4] of group 0");
  p.mutable_grad() = at::zeros({12});
  EXPECT_ERROR(opt.step(), "AdamW: a gradient of shape [12] for parameter [3, 4] of group 0");
  EXPECT_TRUE(at::equal(p.detach(), initial()));
  EXPECT_EQ(opt.state_of(p, /*create=*/false), nullptr);
  EXPECT_ERROR(opt.state_of(at::zeros({2}), /*create=*/true),
               "AdamW: a parameter of shape [2] that is in none of the optimizer's groups");
  torch::serialize::OutputArchive archive;
  EXPECT_ERROR(opt.save(archive), "te::optim::AdamW: a torch::serialize archive would lose");
}

at::Tensor global_input() { return test::seeded_integers({4, 6, 16}, 31).to(at::kFloat) / 7.0; }
at::Tensor output_weight() { return test::seeded_integers({4, 6, 16}, 32).to(at::kFloat) / 5.0; }
constexpr int kSteps = 3;

// One process: three steps of AdamW (weight decay groups) on a layer; the parameters after. The
// key bias's gradient is rounding noise below 1e-4 (a key bias shifts every score of a query
// alike), which Adam's g / (sqrt(v) + eps) would blow up to a step of up to lr either way: eps 1
// keeps that below 1e-6 (the other gradients are 0.3 to 30).
std::map<std::string, at::Tensor> reference_params() {
  manual_seed(21);
  TransformerLayer layer = make_layer(false);
  te::optim::AdamW opt(*layer, AdamWOptions(1e-2).eps(1).weight_decay(0.1));
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    (layer(global_input()) * output_weight()).sum().backward();
    opt.step();
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& p : layer->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

// `layout`'s ranks: kSteps steps of the layer under AdamW (ZeRO-1 over `zero_axis` when given,
// with a checkpoint saved before the last step into `save_dir` when given); each rank's pieces of
// the parameters after must be one process's. Returns rank 0's parameters.
std::map<std::string, at::Tensor> steps_like_one_process(const test::MatrixLayout& layout,
                                                         const std::string& zero_axis = "",
                                                         const std::string& save_dir = "") {
  std::map<std::string, at::Tensor> rank0;
  const auto ref = reference_params();
  set_warning_handler([](std::string_view) {});
  int64_t world = 1;
  for (int64_t s : layout.shape) world *= s;
  run_local_ranks(static_cast<int>(world), [&](int rank) {
    DeviceMesh mesh(layout.shape, layout.axes);
    MeshScope mesh_scope(mesh);
    MeshResourceScope resource_scope(parse_mesh_resource(layout.mesh_resource));
    manual_seed(21);
    TransformerLayer layer = make_layer(layout.sequence_parallel);
    std::optional<te::optim::ZeroSharding> zero;
    if (!zero_axis.empty()) zero = te::optim::ZeroSharding{mesh, zero_axis};
    te::optim::AdamW opt(*layer, AdamWOptions(1e-2).eps(1).weight_decay(0.1),
                         te::optim::default_no_decay, zero);
    const LogicalAxes in_axes = {"batch", layout.sequence_parallel ? "seqlen_tp" : "seqlen",
                                 "hidden"};
    const auto in_placements = placements_for(*resolve_logical_axes(in_axes), mesh);
    const DTensor x = DTensor::from_local(piece_of(global_input(), mesh, in_placements, rank), mesh,
                                          in_placements, std::vector<int64_t>{4, 6, 16});
    for (int step = 0; step < kSteps; ++step) {
      if (step == kSteps - 1 && !save_dir.empty()) save_checkpoint(*layer, save_dir, "{}", &opt);
      opt.zero_grad();
      GradientBuckets buckets;
      (layer(x).full_tensor() * output_weight()).sum().backward();
      buckets.finish();
      opt.step();
    }
    const auto layouts = named_parameter_layouts(*layer);
    int64_t state = 0, params = 0;
    for (const auto& p : layer->named_parameters()) {
      const ParameterLayout& pl = layouts.at(p.key());
      const at::Tensor want =
          pl.mesh ? piece_of(ref.at(p.key()), mesh, pl.placements, rank) : ref.at(p.key());
      EXPECT_TRUE(at::allclose(p.value().detach(), want, 1e-5, 1e-5))
          << p.key() << " on rank " << rank << ": max difference "
          << (p.value().detach() - want).abs().max().item<double>();
      state += opt.state_of(p.value(), /*create=*/false)->exp_avg().numel();
      params += p.value().numel();
      if (rank == 0) rank0[p.key()] = p.value().detach().clone();
    }
    // ZeRO-1 holds one torch.chunk of each replicated parameter's state: about 1/n of it.
    const int64_t n = zero_axis.empty() ? 1 : mesh.size(zero_axis);
    EXPECT_LE(state, params / n + 32) << "state elements on rank " << rank;
    EXPECT_GE(state, params / n - 32) << "state elements on rank " << rank;
  });
  set_warning_handler(nullptr);
  return rank0;
}

class AdamWLayouts : public ::testing::TestWithParam<test::MatrixLayout> {};

// The state is each rank's piece of its parameter's: every layout steps like one process.
TEST_P(AdamWLayouts, StepsLikeOneProcess) { steps_like_one_process(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Layouts, AdamWLayouts, ::testing::ValuesIn(test::matrix_layouts()),
                         [](const auto& info) { return info.param.name; });

const test::MatrixLayout& layout_named(const std::string& name) {
  for (const auto& l : test::matrix_layouts()) {
    if (l.name == name) return l;
  }
  throw std::runtime_error("no layout " + name);
}

// ZeRO-1: the state of parameters replicated over the data axis split over it (DP2; with TP,
// the chunks of each TP piece; beside FSDP, the chunks of each FSDP shard; over an FSDP axis,
// nothing left to split): the same parameters as one process, half the state.
TEST(AdamWZeroLayouts, StepsLikeOneProcessWithItsShareOfTheState) {
  steps_like_one_process(layout_named("DP2"), "data");
  steps_like_one_process(layout_named("DP2xTP2"), "data");
  steps_like_one_process(layout_named("DP2xFSDP2"), "data");
}

// A ZeRO-1 checkpoint holds the state whole, laid out as the parameters: resumed under ZeRO-1 on
// DP2 the last step is the uninterrupted run's, bit for bit; loaded on one process (no ZeRO),
// the last step is one process's.
TEST(AdamWZeroLayouts, CheckpointsReshardToAnyLayout) {
  test::TempDir dir("te_zero_ckpt");
  const std::string ckpt = (dir.path() / "ckpt").string();
  const auto uninterrupted = steps_like_one_process(layout_named("DP2"), "data", ckpt);
  const auto ref = reference_params();
  set_warning_handler([](std::string_view) {});
  std::vector<std::map<std::string, at::Tensor>> resumed(2);
  run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh({2}, {"data"});
    MeshScope mesh_scope(mesh);
    MeshResourceScope resource_scope(parse_mesh_resource("dp=data"));
    manual_seed(5);  // other initial weights: the checkpoint must replace them
    TransformerLayer layer = make_layer(false);
    te::optim::AdamW opt(*layer, AdamWOptions(1e-2).eps(1).weight_decay(0.1),
                         te::optim::default_no_decay, te::optim::ZeroSharding{mesh, "data"});
    load_checkpoint(*layer, ckpt, {}, &opt);
    const auto in = placements_for(*resolve_logical_axes({"batch", "seqlen", "hidden"}), mesh);
    const DTensor x = DTensor::from_local(piece_of(global_input(), mesh, in, rank), mesh, in,
                                          std::vector<int64_t>{4, 6, 16});
    opt.zero_grad();
    GradientBuckets buckets;
    (layer(x).full_tensor() * output_weight()).sum().backward();
    buckets.finish();
    opt.step();
    for (const auto& p : layer->named_parameters()) {
      resumed[static_cast<std::size_t>(rank)][p.key()] = p.value().detach().clone();
    }
  });
  set_warning_handler(nullptr);
  for (const auto& [name, want] : uninterrupted) {
    EXPECT_TRUE(at::equal(resumed[0].at(name), want)) << name << " on rank 0";
    EXPECT_TRUE(at::equal(resumed[1].at(name), want)) << name << " on rank 1";
  }
  // One process, no ZeRO: the moments and masters read whole.
  manual_seed(5);
  TransformerLayer layer = make_layer(false);
  te::optim::AdamW opt(*layer, AdamWOptions(1e-2).eps(1).weight_decay(0.1));
  load_checkpoint(*layer, ckpt, {}, &opt);
  opt.zero_grad();
  (layer(global_input()) * output_weight()).sum().backward();
  opt.step();
  for (const auto& p : layer->named_parameters()) {
    EXPECT_TRUE(at::allclose(p.value().detach(), ref.at(p.key()), 1e-5, 1e-5)) << p.key();
  }
}

TEST(AdamWZeroLayouts, BadShardingIsNamed) {
  manual_seed(21);
  TransformerLayer layer = make_layer(false);
  DeviceMesh mesh({1}, {"data"});
  EXPECT_ERROR(te::optim::AdamW(*layer, AdamWOptions(), te::optim::default_no_decay,
                                te::optim::ZeroSharding{mesh, "dp"}),
               "AdamW: ZeroSharding axis 'dp' is not an axis of DeviceMesh(data=1)");
}

}  // namespace
}  // namespace te::nn
