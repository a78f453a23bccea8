// te::nn::plan against real runs: for one process and every layout of the equivalence matrix
// (1, 2 and 4 ranks), the collectives the planner records on meta tensors in a simulated world
// are, rank by rank and in order, the ones CommTrace records in a real step on Gloo ranks (kind,
// mesh axis, bytes), and its step peak is within 10% of the peak bytes a counting allocator
// measures in the real step (Adam, second step, so the optimizer state is live).

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adam.h>

#include <cmath>
#include <mutex>

#include "../distributed/dist_test_util.h"
#include "../expect_error.h"
#include "matrix_layouts.h"
#include "te/nn.h"
#include "te/runtime/meta.h"

namespace te::nn {
namespace {

// A layout of the matrix, or one process, with the dtype and FP8 recipe of the run.
struct Layout {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> axes;
  std::string mesh_resource;
  bool sequence_parallel = false;
  at::ScalarType dtype = at::kFloat;
  std::optional<fp8::Recipe> fp8 = std::nullopt;
  bool llama = false;  // GQA (2 key/value heads), swiglu, RMSNorm: a decoder's layer
  std::optional<CpCommType> cp = std::nullopt;  // context parallelism over MeshResource cp
  std::string rules = "";                       // (a2a+p2p: its two axes, by a rule)
};

void PrintTo(const Layout& l, std::ostream* os) { *os << l.name; }

Layout from_matrix(const std::string& name, at::ScalarType dtype = at::kFloat,
                   std::optional<fp8::Recipe> fp8 = std::nullopt, const std::string& suffix = "") {
  for (const test::MatrixLayout& m : test::matrix_layouts()) {
    if (m.name == name) {
      return {m.name + suffix, m.shape, m.axes, m.mesh_resource, m.sequence_parallel, dtype, fp8};
    }
  }
  throw std::runtime_error("no matrix layout " + name);
}

// One process, every layout of the equivalence matrix, and bf16 and FP8 runs on some.
std::vector<Layout> layouts() {
  std::vector<Layout> all = {{"One", {}, {}, ""}};
  for (const test::MatrixLayout& m : test::matrix_layouts()) all.push_back(from_matrix(m.name));
  all.push_back(from_matrix("TP2SP", at::kBFloat16, std::nullopt, "_BF16"));
  all.push_back(
      from_matrix("DP2xTP2", at::kFloat, fp8::Recipe{fp8::DelayedScaling{}}, "_Fp8Delayed"));
  all.push_back(from_matrix("TP2", at::kFloat, fp8::Recipe{fp8::CurrentScaling{}}, "_Fp8Current"));
  all.push_back(
      from_matrix("DP2xTP2", at::kFloat, fp8::Recipe{fp8::Float8BlockScaling{}}, "_Fp8Block"));
  all.push_back(from_matrix("TP2", at::kFloat, fp8::Recipe{fp8::MXFP8BlockScaling{}}, "_Fp8Mx"));
  all.push_back(
      from_matrix("DP2xTP2", at::kFloat, fp8::Recipe{fp8::NVFP4BlockScaling{}}, "_Fp8Nvfp4"));
  for (const char* name : {"TP2", "DP2xTP2"}) {
    all.push_back(from_matrix(name, at::kFloat, std::nullopt, "_Llama"));
    all.back().llama = true;
  }
  // Context parallelism: each cp_comm_type's traffic (ring steps, gathers, all-to-alls).
  all.push_back({"CP2_p2p", {2}, {"cp"}, "cp=cp"});
  all.back().cp = CpCommType::kP2P;
  all.push_back({"DP2xCP2_all_gather", {2, 2}, {"data", "cp"}, "dp=data,cp=cp"});
  all.back().cp = CpCommType::kAllGather;
  all.push_back({"CP2xTP2_a2a", {2, 2}, {"cp", "model"}, "cp=cp,tp=model"});
  all.back().cp = CpCommType::kA2A;
  all.push_back({"CP2x2_a2a_p2p", {2, 2}, {"ring", "a2a"}, ""});
  all.back().cp = CpCommType::kA2AP2P;
  all.back().rules = "seqlen_cp=(ring,a2a)";
  return all;
}

constexpr int64_t kBatch = 4, kSeq = 32, kHidden = 64, kLayers = 2;

PlanOptions options_for(const Layout& l) {
  TransformerLayerOptions layer(kHidden, 4 * kHidden, 4);
  layer.mlp_activations({"gelu"});
  layer.self_attention().enable_sequence_parallel(l.sequence_parallel);
  if (l.llama) {
    layer.mlp_activations({"swiglu"});
    layer.self_attention().attention().num_gqa_groups(2);
    layer.self_attention().layernorm().layernorm_type("rmsnorm");
  }
  if (l.cp) layer.self_attention().attention().cp_comm_type(*l.cp);
  PlanOptions o(layer, kLayers, kBatch, kSeq);
  // Buckets small beside the model, as in real runs (25 MiB beside gigabytes): Gloo may free a
  // bucket a moment after its all-reduce returns, and only a bucket's bytes may be live then.
  o.mesh_shape(l.shape).mesh_axes(l.axes).dtype(l.dtype).fp8(l.fp8).bucket_bytes(64 * 1024);
  return o;
}

// What a real rank saw in its second training step.
struct Measured {
  std::vector<CommRecord> forward, backward;
  int64_t parameter_bytes = 0;
  int64_t peak_bytes = 0;
};

// One rank's real training steps: the same model, input layout and step as the planner's, on
// CPU tensors with real data, Adam, gradients set to none between steps.
Measured measure(const Layout& l, const PlanOptions& o) {
  Measured m;
  // The batch a data loader hands the step is not the model's: made before counting.
  const at::Tensor global = (test::seeded_integers({kBatch, kSeq, kHidden}, 5) / 7).to(o.dtype());
  AllocationCounter counter(c10::DeviceType::CPU);
  std::optional<DeviceMesh> mesh;
  std::optional<MeshScope> scope;
  if (!l.shape.empty()) {
    mesh.emplace(l.shape, l.axes);
    scope.emplace(*mesh);
  }
  manual_seed(3);
  std::vector<TransformerLayer> layers;
  std::vector<at::Tensor> params;
  for (int64_t i = 0; i < o.layers(); ++i) {
    layers.emplace_back(o.layer());
    layers.back()->to(o.dtype());
    for (const at::Tensor& p : layers.back()->parameters()) {
      params.push_back(p);
      m.parameter_bytes += p.numel() * static_cast<int64_t>(p.element_size());
    }
  }
  torch::optim::Adam adam(params, torch::optim::AdamOptions(1e-4));
  for (int step = 0; step < 2; ++step) {
    counter.reset_peak();
    at::Tensor out;
    {
      CommTrace trace;
      std::optional<Fp8Autocast> autocast;
      if (o.fp8()) autocast.emplace(true, *o.fp8());
      if (mesh) {
        const LogicalAxes axes = {"batch", l.sequence_parallel ? "seqlen_tp" : "seqlen", "hidden"};
        DTensor x =
            DTensor::distribute(global, *mesh, placements_for(*resolve_logical_axes(axes), *mesh));
        for (TransformerLayer& layer : layers) x = layer(x);
        out = x.to_local();
      } else {
        out = global;
        for (TransformerLayer& layer : layers) out = layer(out);
      }
      autocast.reset();
      m.forward = trace.records();
    }
    {
      CommTrace trace;
      std::optional<GradientBuckets> buckets;
      if (mesh) buckets.emplace(o.bucket_bytes());
      torch::autograd::backward({out}, {at::ones_like(out)});
      if (buckets) buckets->finish();
      m.backward = trace.records();
    }
    out = at::Tensor();
    adam.step();
    for (at::Tensor& p : params) p.mutable_grad() = at::Tensor();
  }
  m.peak_bytes = counter.peak_bytes();
  return m;
}

std::string text(const std::vector<CommRecord>& records) {
  std::string out;
  for (const CommRecord& r : records) {
    out += "  " + to_string(r.kind) + " '" + r.mesh_axis + "' " + std::to_string(r.bytes) + "\n";
  }
  return out;
}

void expect_same(const std::vector<CommRecord>& planned, const std::vector<CommRecord>& real,
                 const std::string& what) {
  bool same = planned.size() == real.size();
  for (std::size_t i = 0; same && i < planned.size(); ++i) {
    same = planned[i].kind == real[i].kind && planned[i].mesh_axis == real[i].mesh_axis &&
           planned[i].bytes == real[i].bytes;
  }
  EXPECT_TRUE(same) << what << ": planned\n" << text(planned) << "ran\n" << text(real);
}

class Planner : public ::testing::TestWithParam<Layout> {};

TEST_P(Planner, MatchesCommTraceAndMeasuredMemoryOfARealStep) {
  const Layout& l = GetParam();
  set_warning_handler([](std::string_view) {});
  std::optional<MeshResourceScope> resource;
  if (!l.mesh_resource.empty()) resource.emplace(parse_mesh_resource(l.mesh_resource));
  std::optional<AxisRulesScope> rules;
  if (!l.rules.empty()) rules.emplace(parse_axis_rules(l.rules));
  const PlanOptions o = options_for(l);
  int64_t world = 1;
  for (int64_t s : l.shape) world *= s;
  std::vector<Plan> plans;
  for (int r = 0; r < world; ++r) plans.push_back(plan(PlanOptions(o).rank(r)));

  std::mutex mutex;
  std::vector<Measured> measured(static_cast<std::size_t>(world));
  run_local_ranks(static_cast<int>(world), [&](int rank) {
    Measured m = measure(l, o);
    std::lock_guard<std::mutex> lock(mutex);
    measured[static_cast<std::size_t>(rank)] = std::move(m);
  });
  set_warning_handler(nullptr);

  for (int r = 0; r < world; ++r) {
    const Plan& p = plans[static_cast<std::size_t>(r)];
    const Measured& m = measured[static_cast<std::size_t>(r)];
    const std::string on = l.name + " rank " + std::to_string(r);
    expect_same(p.forward, m.forward, on + " forward");
    expect_same(p.backward, m.backward, on + " backward");
    EXPECT_EQ(p.parameter_bytes, m.parameter_bytes) << on;
    EXPECT_EQ(p.gradient_bytes, p.parameter_bytes) << on;
    EXPECT_EQ(p.optimizer_bytes, 2 * p.parameter_bytes) << on;
    EXPECT_NEAR(static_cast<double>(p.peak_bytes), static_cast<double>(m.peak_bytes),
                0.10 * static_cast<double>(m.peak_bytes))
        << on << ": planned peak " << p.peak_bytes << " bytes, measured " << m.peak_bytes;
  }
  // Every layout but one process and pure data parallelism moves activations or weights.
  if (world > 1) EXPECT_FALSE(plans[0].backward.empty()) << l.name;
}

INSTANTIATE_TEST_SUITE_P(Layouts, Planner, ::testing::ValuesIn(layouts()),
                         [](const auto& info) { return info.param.name; });

TEST(Planner, PlansAMeshOfThousandsOfRanksInOneProcess) {
  MeshResourceScope resource(parse_mesh_resource("dp=data,tp=model"));
  set_warning_handler([](std::string_view) {});
  // Two 7B-shaped layers on 64 x 16 ranks: TP shards every kernel 16 ways.
  const Plan p =
      plan(PlanOptions(
               [&] {
                 auto made = TransformerLayerOptions(4096, 11008, 32).mlp_activations({"swiglu"});
                 made.self_attention().layernorm().layernorm_type("rmsnorm");
                 return made;
               }(),
               2, 64, 2048)
               .mesh_shape({64, 16})
               .mesh_axes({"data", "model"})
               .dtype(at::kBFloat16));
  set_warning_handler(nullptr);
  EXPECT_EQ(p.world_size, 1024);
  // qkv 4096 x 3 x 4096, out 4096^2, fc1 4096 x 2 x 11008, fc2 11008 x 4096, over 16 ranks;
  // the two norms' scales whole.
  const int64_t kernels = 4096 * 3 * 4096 + 4096 * 4096 + 4096 * 2 * 11008 + 11008 * 4096;
  EXPECT_EQ(p.parameters, 2 * (kernels / 16 + 2 * 4096));
  EXPECT_EQ(p.parameter_bytes, 2 * p.parameters);
  // Megatron: two all-reduces of a [1, 2048, 4096] bf16 activation per layer forward.
  int64_t forward_model = 0;
  for (const PlannedCollectives& c : p.collectives) {
    if (c.phase == "forward" && c.kind == Collective::kAllReduce && c.mesh_axis == "model") {
      EXPECT_EQ(c.count, 4);
      forward_model = c.bytes;
    }
  }
  EXPECT_EQ(forward_model, 4 * 2048 * 4096 * 2);
  EXPECT_NE(p.to_json().find("\"world_size\": 1024"), std::string::npos);
  EXPECT_NE(p.table().find("data=64 x model=16"), std::string::npos) << p.table();
}

// Planning counts its dropouts as calls of this thread's stream; the caller's stream is put back.
TEST(Planner, LeavesTheCallersDropoutStreamAsItWas) {
  TransformerLayerOptions layer(64, 128, 4);
  layer.hidden_dropout(0.1);
  set_rng_state({7, 5});
  plan(PlanOptions(layer, 2, 4, 8));
  EXPECT_EQ(rng_state().seed, 7u);
  EXPECT_EQ(rng_state().calls, 5u);
}

// A mixture of experts on EP2 (experts and batch over one axis): meta tensors hold no values to
// route by, so the plan routes as a balanced router would. Its collectives are a real step's,
// one for one: per layer the counts' exchange, the rows out to the experts and back (whose
// bytes are this rank's routed rows, tokens x topk, whatever the router chose); the bytes of the
// return trip are the balanced share, which a real router only approaches. (Without dropout:
// with the experts' dropout on, each row's mask id travels with it, a fourth all-to-all.)
TEST(Planner, PlansAMixtureOfExpertsAsABalancedRouterSendsItsTokens) {
  set_warning_handler([](std::string_view) {});
  MeshResourceScope resource(parse_mesh_resource("dp=data,ep=data"));
  Layout l{"EP2", {2}, {"data"}, "dp=data,ep=data"};
  PlanOptions o = options_for(l);
  auto moe = LayerNormMoEOptions(kHidden, kHidden, 4).activations({"silu", "linear"});
  moe.router().topk = 2;
  o.layer().moe(moe);
  const Plan p = plan(PlanOptions(o).rank(0));
  std::mutex mutex;
  Measured m;
  run_local_ranks(2, [&](int rank) {
    Measured mine = measure(l, o);
    std::lock_guard<std::mutex> lock(mutex);
    if (rank == 0) m = std::move(mine);
  });
  set_warning_handler(nullptr);
  const int64_t rows = kBatch / 2 * kSeq * 2;  // this rank's tokens, two experts each
  std::vector<CommRecord> a2a, real;
  for (const CommRecord& r : p.forward) {
    if (r.kind == Collective::kAllToAll) a2a.push_back(r);
  }
  for (const CommRecord& r : m.forward) {
    if (r.kind == Collective::kAllToAll) real.push_back(r);
  }
  ASSERT_EQ(a2a.size(), 3u * kLayers) << text(p.forward);
  ASSERT_EQ(real.size(), a2a.size()) << text(m.forward);
  for (std::size_t i = 0; i < a2a.size(); i += 3) {
    EXPECT_EQ(a2a[i].bytes, 4 * 8);                   // the expert counts
    EXPECT_EQ(a2a[i + 1].bytes, rows * kHidden * 4);  // every routed row, out
    EXPECT_EQ(a2a[i + 2].bytes, rows * kHidden * 4);  // balanced: as many back
    EXPECT_EQ(real[i].bytes, a2a[i].bytes);
    EXPECT_EQ(real[i + 1].bytes, a2a[i + 1].bytes);
  }
  EXPECT_EQ(p.parameter_bytes, m.parameter_bytes);
}

TEST(Planner, RefusesOptionsItCannotPlanNamingThem) {
  const TransformerLayerOptions layer(64, 128, 4);
  EXPECT_ERROR(plan(PlanOptions(layer, 0, 4, 8)), "layers must be at least 1");
  EXPECT_ERROR(plan(PlanOptions(layer, 1, 4, 8).mesh_shape({2}).mesh_axes({})),
               "1 mesh dims but 0 axis names");
  EXPECT_ERROR(plan(PlanOptions(layer, 1, 4, 8).optimizer("lion")),
               "optimizer 'lion' is not adam or sgd");
  EXPECT_ERROR(plan(PlanOptions(layer, 1, 4, 8).mesh_shape({2}).mesh_axes({"data"}).rank(2)),
               "rank 2 is not one of the mesh's 2 ranks");
  EXPECT_ERROR(plan(PlanOptions(layer, 1, 4, 8).dtype(at::kDouble)),
               "dtype Double is not float32, bfloat16 or float16");
  // What a real build refuses, the plan refuses the same way: 4 heads over 8 ranks.
  MeshResourceScope resource(parse_mesh_resource("tp=tp"));
  set_warning_handler([](std::string_view) {});
  EXPECT_THROW(plan(PlanOptions(layer, 1, 4, 8).mesh_shape({8}).mesh_axes({"tp"})), te::Error);
  set_warning_handler(nullptr);
  // plan_step: a step without its parts, or without a micro-batch.
  EXPECT_ERROR(plan_step({}, PlannedStep{}), "the PlannedStep needs build and forward");
  PlannedStep none;
  none.build = [] { return std::vector<std::shared_ptr<torch::nn::Module>>{}; };
  none.forward = [](int64_t) { return at::Tensor(); };
  none.micro_batches = 0;
  EXPECT_ERROR(plan_step({}, none), "micro_batches must be at least 1, got 0");
}

}  // namespace
}  // namespace te::nn
