// LayerNormMoE (te/nn/moe_layer.h): on one process equal to the same math written out token by
// token, and on every layout (data parallel, FSDP, tensor parallel within the experts, expert
// parallel by all-to-all and on whole tokens, and their products) equal to one process in its
// output, its auxiliary loss and every parameter's gradient.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "../expect_error.h"
#include "nn_test_util.h"
#include "te/distributed.h"
#include "te/fp8.h"
#include "te/nn/init.h"
#include "te/nn/moe_layer.h"
#include "te/nn/transformer.h"

namespace te::nn {
namespace {

using test::Close;

// With constraints as TransformerLayer gives them (`constrained`), or none: the input then stays
// as it comes (whole on every rank here).
LayerNormMoEOptions small_options(bool constrained = true, double dropout = 0) {
  auto o = LayerNormMoEOptions(8, 6, 4)
               .intermediate_dropout_rate(dropout)
               .use_bias(true)
               .router_bias(true)
               .shared_expert_size(4)
               .shared_expert_gate(true)
               .aux_loss_coeff(0.01)
               .z_loss_coeff(0.001);
  o.layernorm().layernorm_type("rmsnorm");
  o.router().topk = 2;
  if (constrained) {
    o.layernorm_input_axes({axis::kBatch, axis::kSeqlenTp, axis::kHidden})
        .dot_1_input_axes({axis::kBatch, axis::kSeqlen, axis::kHidden})
        .output_axes({axis::kBatch, axis::kSeqlenTp, axis::kHidden});
  }
  return o;
}

// Every parameter moved off its initial value (zero biases, unit norms), the same on each rank.
void perturb(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  int64_t i = 0;
  for (auto& p : m.named_parameters()) {
    at::Tensor whole = test::randn(p.value().sizes().vec(), 100 + i++) * 0.3;
    p.value().copy_(whole);
  }
}

TEST(MoeLayer, EachTokenGoesThroughItsTopkExpertsAndTheGatedSharedExpert) {
  manual_seed(4);
  LayerNormMoE moe(small_options());
  perturb(*moe);
  const at::Tensor x = test::randn({3, 5, 8}, 9);
  const at::Tensor y = moe(x);
  // The same written out token by token, as transformers' Qwen2-MoE block computes it.
  const at::Tensor ln = moe->layernorm(x).reshape({-1, 8});
  const at::Tensor logits = at::matmul(ln, moe->gate_kernel) + moe->gate_bias;
  at::Tensor expected = at::zeros_like(ln);
  for (int64_t t = 0; t < ln.size(0); ++t) {
    const auto [top, idx] = at::topk(at::softmax(logits[t], -1), 2);
    const at::Tensor w = top / top.sum();
    for (int64_t k = 0; k < 2; ++k) {
      const int64_t e = idx[k].item<int64_t>();
      const at::Tensor h =
          at::matmul(ln[t], moe->wi_kernel[e].reshape({8, 12})) + moe->wi_bias[e].reshape({12});
      const at::Tensor act = at::silu(h.narrow(0, 0, 6)) * h.narrow(0, 6, 6);
      expected[t] += w[k] * (at::matmul(act, moe->wo_kernel[e]) + moe->wo_bias[e]);
    }
    const at::Tensor sh = at::matmul(ln[t], moe->shared_wi_kernel.reshape({8, 8}));
    const at::Tensor shared =
        at::matmul(at::silu(sh.narrow(0, 0, 4)) * sh.narrow(0, 4, 4), moe->shared_wo_kernel);
    expected[t] += at::sigmoid(at::matmul(ln[t], moe->shared_gate_kernel)) * shared;
  }
  EXPECT_TRUE(Close(y.reshape({-1, 8}), expected, 1e-5));
}

TEST(MoeLayer, TheAuxiliaryLossIsTheSwitchLossPlusTheZLoss) {
  manual_seed(4);
  LayerNormMoE moe(small_options());
  perturb(*moe);
  const at::Tensor x = test::randn({2, 6, 8}, 3);
  const auto [y, aux] = moe->forward_with_aux_loss(x);
  const at::Tensor ln = moe->layernorm(x).reshape({-1, 8});
  const at::Tensor logits = at::matmul(ln, moe->gate_kernel) + moe->gate_bias;
  const at::Tensor p = at::softmax(logits, -1);
  const at::Tensor chosen = at::zeros_like(p).scatter_(1, std::get<1>(at::topk(p, 2)), 1.0);
  const double t = 12, e = 4, k = 2;
  const at::Tensor switch_loss = (p.sum(0) * chosen.sum(0)).sum() * (e * 0.01 / (k * t * t));
  const at::Tensor z = at::logsumexp(logits, -1).pow(2).mean() * 0.001;
  EXPECT_TRUE(Close(aux, switch_loss + z, 1e-5));
}

// transformers' load_balancing_loss_func over two layers' router logits taken as one batch:
// experts · Σ_e (selections of e / all tokens) · (softmax mass of e / all tokens), where all
// tokens counts each layer's once; not the sum of two per-layer losses.
TEST(MoeLayer, TheLoadBalancingLossTakesEveryLayerAsOneBatch) {
  manual_seed(3);
  auto o = LayerNormMoEOptions(8, 6, 4);
  o.router().topk = 2;
  LayerNormMoE first(o), second(o);
  const at::Tensor x = test::randn({2, 5, 8}, 31);
  RouterLoadScope loads;
  const at::Tensor h = first(x);
  second(h);
  ASSERT_EQ(loads.loads().size(), 2u);
  at::Tensor chosen = at::zeros({4}), mass = at::zeros({4});
  for (auto [layer, input] :
       std::vector<std::pair<LayerNormMoE, at::Tensor>>{{first, x}, {second, h.detach()}}) {
    const at::Tensor ln = layer->layernorm->forward(input).reshape({-1, 8});
    const at::Tensor p = at::softmax(at::matmul(ln, layer->gate_kernel), -1);
    chosen = chosen + at::zeros_like(p).scatter_(1, std::get<1>(at::topk(p, 2)), 1.0).sum(0);
    mass = mass + p.sum(0);
  }
  const at::Tensor want = (chosen / 20 * (mass / 20)).sum() * 4;
  const at::Tensor got = load_balancing_loss(loads.loads());
  EXPECT_TRUE(Close(got, want, 1e-6));
  // Differentiable in the routers' kernels (through the softmax mass).
  got.backward();
  EXPECT_GT(first->gate_kernel.grad().abs().sum().item<double>(), 0);
  EXPECT_GT(second->gate_kernel.grad().abs().sum().item<double>(), 0);
  // A scope records only while open, innermost first.
  {
    RouterLoadScope inner;
    first(x);
    EXPECT_EQ(inner.loads().size(), 1u);
  }
  EXPECT_EQ(loads.loads().size(), 2u);
  EXPECT_ERROR(load_balancing_loss({}), "load_balancing_loss: no router load");
  std::vector<RouterLoad> mixed = loads.loads();
  mixed[1].selected = at::zeros({3});
  EXPECT_ERROR(load_balancing_loss(mixed), "router load 1 has 3 experts and load 0 has 4");
}

// The experts' dropout fires in training only (the layouts hold where its masks fall).
TEST(MoeLayer, TheExpertsDropoutDropsInTrainingOnly) {
  manual_seed(3);
  auto o = small_options(false, 0.5).shared_expert_size(0).shared_expert_gate(false);
  LayerNormMoE moe(o);
  const at::Tensor x = test::randn({2, 5, 8}, 41);
  moe->eval();
  const at::Tensor y_eval = moe(x);
  moe->train();
  const at::Tensor y_train = moe(x);
  EXPECT_FALSE(at::allclose(y_train, y_eval));
  // Its own draw each call.
  EXPECT_FALSE(at::allclose(moe(x), y_train));
  manual_seed(3);
  LayerNormMoE no_dropout(
      small_options(false, 0.0).shared_expert_size(0).shared_expert_gate(false));
  EXPECT_TRUE(at::allclose(no_dropout(x), y_eval));
}

struct Layout {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> axes;
  std::string resource;
  bool constrained = true;
};

struct Result {
  at::Tensor y, aux, balance;  // balance: load_balancing_loss of the forward's router load
  std::map<std::string, at::Tensor> grads;
};

// The layouts run with dropout on (the experts' rows and the shared expert's): each row's mask
// follows its token and expert to whichever rank runs it.
constexpr double kLayoutDropout = 0.25;

Result run_whole(const at::Tensor& x, const at::Tensor& w) {
  manual_seed(4);
  LayerNormMoE moe(small_options(true, kLayoutDropout));
  perturb(*moe);
  const at::Tensor xl = x.clone().requires_grad_(true);
  RouterLoadScope loads;
  auto [y, aux] = moe->forward_with_aux_loss(xl);
  const at::Tensor balance = load_balancing_loss(loads.loads());
  ((y * w).sum() + aux + balance * 0.5).backward();
  Result r{y.detach(), aux.detach(), balance.detach(), {}};
  for (const auto& p : moe->named_parameters()) r.grads[p.key()] = p.value().grad();
  r.grads["input"] = xl.grad();
  return r;
}

void PrintTo(const Layout& layout, std::ostream* os) { *os << layout.name; }

// A parameter's gradient, whole: gathered from the mesh where the module holds it sharded.
at::Tensor whole_grad(const torch::nn::Module& module, const std::string& name,
                      const at::Tensor& parameter) {
  const ParameterLayout l = named_parameter_layouts(module).at(name);
  return l.mesh ? DTensor::from_local(parameter.grad(), *l.mesh, l.placements, l.global_shape)
                      .full_tensor()
                : parameter.grad();
}

// check(what, got, want): records `what` unless got is within 1e-5 of want.
using Check = std::function<void(const std::string&, const at::Tensor&, const at::Tensor&)>;

// Runs body(mesh, resource, check) on `layout`'s thread ranks, each with the layout's mesh and
// MeshResource in scope (warnings off); what check records is reported with its rank once the
// ranks have joined.
void on_layout(
    const Layout& layout,
    const std::function<void(const DeviceMesh&, const MeshResource&, const Check&)>& body) {
  int64_t ranks = 1;
  for (int64_t s : layout.shape) ranks *= s;
  std::mutex failures_mutex;
  std::vector<std::string> failures;
  run_local_ranks(static_cast<int>(ranks), [&](int rank) {
    DeviceMesh mesh(layout.shape, layout.axes);
    MeshScope on(mesh);
    const MeshResource resource = parse_mesh_resource(layout.resource);
    MeshResourceScope roles(resource);
    set_warning_handler([](std::string_view) {});
    const Check check = [&](const std::string& what, const at::Tensor& got,
                            const at::Tensor& want) {
      if (auto result = Close(got, want, 1e-5); !result) {
        std::lock_guard<std::mutex> lock(failures_mutex);
        failures.push_back("rank " + std::to_string(rank) + " " + what + ": " + result.message());
      }
    };
    body(mesh, resource, check);
    set_warning_handler(nullptr);
  });
  for (const std::string& f : failures) ADD_FAILURE() << f;
}

class MoeLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(MoeLayouts, OutputAuxLossLoadBalancingLossAndEveryGradientMatchOneProcess) {
  const Layout& layout = GetParam();
  const at::Tensor x = test::randn({4, 3, 8}, 21);
  const at::Tensor w = test::randn({4, 3, 8}, 22);
  const Result whole = run_whole(x, w);
  on_layout(layout, [&](const DeviceMesh& mesh, const MeshResource&, const Check& check) {
    manual_seed(4);
    LayerNormMoE moe(small_options(layout.constrained, kLayoutDropout));
    int64_t i = 0;
    for (auto& p : moe->named_parameters()) {
      // The one-process weights (perturb's), laid out as this rank holds them.
      const at::Tensor global =
          test::randn(named_parameter_layouts(*moe).at(p.key()).global_shape, 100 + i++) * 0.3;
      set_parameter_from_global(*moe, p.key(), global);
    }
    const at::Tensor xl = x.clone().requires_grad_(true);
    const DTensor dx =
        DTensor::distribute(xl, mesh, std::vector<Placement>(layout.shape.size(), Replicate{}));
    RouterLoadScope loads;
    auto [y, aux] = moe->forward_with_aux_loss(dx);
    const at::Tensor y_full = y.full_tensor();
    const at::Tensor aux_full = aux.full_tensor();
    // The router load: the whole batch's on every rank, each rank's gradient its own tokens'.
    const at::Tensor balance = load_balancing_loss(loads.loads());
    ((y_full * w).sum() + aux_full + balance * 0.5).backward();
    check("output", y_full.detach(), whole.y);
    check("aux loss", aux_full.detach(), whole.aux);
    check("load-balancing loss", balance.detach(), whole.balance);
    check("input gradient", xl.grad(), whole.grads.at("input"));
    for (const auto& p : moe->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << p.key() << " has no gradient";
      check(p.key() + " gradient", whole_grad(*moe, p.key(), p.value()), whole.grads.at(p.key()));
    }
  });
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, MoeLayouts,
    ::testing::Values(Layout{"DP2", {2}, {"data"}, "dp=data"},
                      Layout{"FSDP2", {2}, {"data"}, "fsdp=data"},
                      Layout{"TP2", {2}, {"model"}, "tp=model"},
                      Layout{"EP2", {2}, {"data"}, "dp=data,ep=data"},
                      Layout{"EP2WholeTokens", {2}, {"expert"}, "ep=expert"},
                      Layout{"DP2xEP2", {2, 2}, {"data", "expert"}, "dp=data,ep=expert"},
                      Layout{"EP2xTP2", {2, 2}, {"data", "model"}, "dp=data,ep=data,tp=model"},
                      Layout{"SP2", {2}, {"model"}, "tpsp=model"},
                      Layout{"FSDP2WholeTokens", {2}, {"data"}, "fsdp=data", false},
                      Layout{"TP2WholeTokens", {2}, {"model"}, "tp=model", false}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

// Under every recipe the experts' GEMMs run quantized, each expert on its own scaling state
// (delayed scaling updates each expert's scales from its own amax), close to the high-precision
// output; the router stays exact, so the same experts are chosen.
TEST(MoeLayer, EveryFp8RecipeScalesEachExpertOnItsOwn) {
  fp8::NVFP4BlockScaling nvfp4;
  nvfp4.disable_stochastic_rounding = true;
  const std::vector<std::pair<fp8::Recipe, double>> recipes = {
      {fp8::DelayedScaling{}, 0.1},
      {fp8::CurrentScaling{}, 0.1},
      {fp8::Float8BlockScaling{fp8::Format::kHybrid, false, 0.0f}, 0.1},
      {fp8::MXFP8BlockScaling{fp8::Format::kHybrid}, 0.1},
      {nvfp4, 0.3}};
  const at::Tensor x = test::randn({4, 32, 64}, 5);
  for (const auto& [recipe, tol] : recipes) {
    SCOPED_TRACE(fp8::to_string(recipe));
    manual_seed(4);
    auto o = LayerNormMoEOptions(64, 64, 4).shared_expert_size(64);
    o.router().topk = 2;
    LayerNormMoE moe(o);
    const at::Tensor want = moe(x).detach();
    at::Tensor y;
    {
      Fp8Autocast fp8(true, recipe);
      y = moe(x);
      y.sum().backward();
    }
    const double err = ((y - want).norm() / want.norm()).item<double>();
    EXPECT_GT(err, 0.0);  // quantized
    EXPECT_LT(err, tol);
    EXPECT_TRUE(moe->wi_kernel.grad().isfinite().all().item<bool>());
    if (std::holds_alternative<fp8::DelayedScaling>(recipe.settings())) {
      // The update at the region's end: each expert's input scale from its own rows' amax.
      std::vector<float> scale;
      for (const auto& meta : moe->wi_fp8) scale.push_back(meta->fwd_scale[0].item<float>());
      for (float v : scale) EXPECT_NE(v, 1.0f);
      // The largest input row goes to two of the four experts: the others see smaller amaxes.
      EXPECT_GT(std::set<float>(scale.begin(), scale.end()).size(), 1u);
    }
  }
}

// Every recipe on the expert-parallel layouts (and DP2): two steps of forward and backward in
// an Fp8Autocast give one process's output and gradients. Each expert's amaxes reduce over the
// ranks that hold it (every mesh dim but ep), each of them running every local expert's GEMMs,
// one of no rows included, so the casts use one process's scales (delayed scaling's second step
// those the first step's reduced amaxes gave).
TEST(MoeLayer, EveryFp8RecipeOnExpertParallelLayoutsIsOneProcess) {
  const std::vector<Layout> layouts = {
      {"DP2", {2}, {"data"}, "dp=data"},
      {"EP2", {2}, {"data"}, "dp=data,ep=data"},
      {"DP2xEP2", {2, 2}, {"data", "expert"}, "dp=data,ep=expert"},
      {"EP2xTP2", {2, 2}, {"data", "model"}, "dp=data,ep=data,tp=model"}};
  auto options = [] {
    // An mlp dim of 256: 128 on each tensor-parallel rank, whole 1x128 blocks (Float8BlockScaling
    // casts each rank's piece in its own blocks: te's fp8::linear on the local piece).
    auto o =
        LayerNormMoEOptions(64, 256, 4).shared_expert_size(256).activations({"silu", "linear"});
    o.router().topk = 2;
    return o;
  };
  const at::Tensor x = test::randn({4, 8, 64}, 5);
  const at::Tensor w = test::randn({4, 8, 64}, 6);
  for (const fp8::Recipe& recipe : test::every_fp8_recipe()) {
    SCOPED_TRACE(fp8::to_string(recipe));
    manual_seed(4);
    LayerNormMoE whole(options());
    at::Tensor want;
    for (int step = 0; step < 2; ++step) {
      whole->zero_grad();
      Fp8Autocast fp8(true, recipe);
      want = whole(x);
      (want * w).sum().backward();
    }
    std::map<std::string, at::Tensor> want_grads;
    for (const auto& p : whole->named_parameters()) want_grads[p.key()] = p.value().grad();
    for (const Layout& layout : layouts) {
      SCOPED_TRACE(layout.name);
      on_layout(layout,
                [&](const DeviceMesh& mesh, const MeshResource& resource, const Check& check) {
                  manual_seed(4);
                  LayerNormMoE moe(options());
                  at::Tensor y;
                  for (int step = 0; step < 2; ++step) {
                    moe->zero_grad();
                    Fp8Autocast fp8(true, recipe, resource);
                    const DTensor dx = DTensor::distribute(
                        x, mesh, std::vector<Placement>(layout.shape.size(), Replicate{}));
                    y = moe->forward(dx).full_tensor();
                    (y * w).sum().backward();
                  }
                  check("output", y.detach(), want.detach());
                  for (const auto& p : moe->named_parameters()) {
                    check(p.key() + " gradient", whole_grad(*moe, p.key(), p.value()),
                          want_grads.at(p.key()));
                  }
                });
    }
  }
}

// TE's table gives exp the ep role first: where ep shares tp's axis, the experts split there
// (each rank whole experts) and the mlp dim stays whole; without ep, tp splits the mlp dim.
TEST(MoeLayer, AnEpAxisSharedWithTpSplitsTheExperts) {
  run_local_ranks(2, [](int) {
    DeviceMesh mesh({2}, {"model"});
    MeshScope on(mesh);
    set_warning_handler([](std::string_view) {});
    {
      MeshResourceScope roles(parse_mesh_resource("tp=model,ep=model"));
      LayerNormMoE moe(LayerNormMoEOptions(8, 6, 4));
      EXPECT_EQ(moe->wi_kernel.sizes(), at::IntArrayRef({2, 8, 2, 6}));
      EXPECT_EQ(moe->wo_kernel.sizes(), at::IntArrayRef({2, 6, 8}));
    }
    {
      MeshResourceScope roles(parse_mesh_resource("tp=model"));
      LayerNormMoE moe(LayerNormMoEOptions(8, 6, 4));
      EXPECT_EQ(moe->wi_kernel.sizes(), at::IntArrayRef({4, 8, 2, 3}));
    }
    set_warning_handler(nullptr);
  });
}

TEST(MoeLayer, BadInputIsNamed) {
  auto topk = small_options();
  topk.router().topk = 5;
  EXPECT_ERROR(LayerNormMoE{topk}, "topk 5 is not in [1, 4]");
  EXPECT_ERROR(LayerNormMoE(small_options().shared_expert_size(0)),
               "shared_expert_gate needs a shared expert");
  EXPECT_ERROR(LayerNormMoE(LayerNormMoEOptions(8, 6, 0)), "num_experts (0)");
  EXPECT_ERROR(LayerNormMoE(small_options().aux_loss_coeff(-1)), "aux_loss_coeff (-1)");
  // A TransformerLayer returns its output alone: it refuses a loss it would drop.
  EXPECT_ERROR(TransformerLayer(TransformerLayerOptions(8, 16, 2).moe(small_options())),
               "moe's aux_loss_coeff (0.01) and z_loss_coeff (0.001) must be 0");
  // Experts that do not split over the ep axis, and experts split differently in wi and wo.
  std::mutex m;
  std::vector<std::string> errors;
  run_local_ranks(3, [&](int) {
    DeviceMesh mesh({3}, {"expert"});
    MeshScope on(mesh);
    AxisRulesScope rules(parse_axis_rules("exp=expert,w_fsdp=,w_joined=,w_tp=,w_no_shard="));
    set_warning_handler([](std::string_view) {});
    LayerNormMoE moe(LayerNormMoEOptions(8, 6, 3));  // 3 experts, 3 ranks: even
    LayerNormMoE uneven(LayerNormMoEOptions(8, 6, 4));
    LayerNormMoE mixed(
        LayerNormMoEOptions(8, 6, 3).wo_kernel_axes({axis::kWNoShard, axis::kWTp, axis::kWFsdp}));
    const DTensor x = DTensor::distribute(test::randn({2, 3, 8}, 1), mesh, {Replicate{}});
    moe(x);
    for (LayerNormMoE* bad : {&uneven, &mixed}) {
      try {
        (*bad)(x);
        std::lock_guard<std::mutex> lock(m);
        errors.push_back("no error");
      } catch (const Error& e) {
        std::lock_guard<std::mutex> lock(m);
        errors.push_back(e.what());
      }
    }
    set_warning_handler(nullptr);
  });
  ASSERT_EQ(errors.size(), 6u);
  for (std::size_t i = 0; i < errors.size(); ++i) {
    const char* want = errors[i].find("do not split evenly") != std::string::npos
                           ? "4 experts do not split evenly over mesh axis 'expert' of 3 ranks"
                           : "split mesh axis 'expert' differently";
    EXPECT_NE(errors[i].find(want), std::string::npos) << errors[i];
  }
}

}  // namespace
}  // namespace te::nn
