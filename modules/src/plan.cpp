#include "te/nn/plan.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <sstream>

#include "te/distributed/dtensor.h"
#include "te/distributed/gradients.h"
#include "te/distributed/mesh.h"
#include "te/error.h"
#include "te/nn/init.h"
#include "te/nn/random.h"
#include "te/runtime/meta.h"
#include "te/sharding/context.h"

namespace te::nn {

namespace {

int64_t bytes_of(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

void check(const PlanOptions& o) {
  TE_CHECK(o.layers() >= 1, "plan: layers must be at least 1, got ", o.layers());
  TE_CHECK(o.batch() >= 1 && o.seqlen() >= 1, "plan: batch and seqlen must be positive, got ",
           o.batch(), " and ", o.seqlen());
  TE_CHECK(o.optimizer() == "adam" || o.optimizer() == "sgd", "plan: optimizer '", o.optimizer(),
           "' is not adam or sgd");
  TE_CHECK(o.dtype() == at::kFloat || o.dtype() == at::kBFloat16 || o.dtype() == at::kHalf,
           "plan: dtype ", c10::toString(o.dtype()), " is not float32, bfloat16 or float16");
  const QkvFormat format = o.layer().self_attention().attention().qkv_format();
  TE_CHECK(format == QkvFormat::kBshd, "plan: attn_input_format '", format,
           "': the planner runs [batch, seqlen, hidden] inputs");
}

void summarise(const std::string& phase, const std::vector<CommRecord>& records,
               std::vector<PlannedCollectives>& out) {
  const std::size_t first = out.size();
  for (const CommRecord& r : records) {
    auto it = std::find_if(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
                           [&](const PlannedCollectives& c) {
                             return c.kind == r.kind && c.mesh_axis == r.mesh_axis;
                           });
    if (it == out.end()) {
      out.push_back({phase, r.kind, r.mesh_axis, 0, 0});
      it = std::prev(out.end());
    }
    ++it->count;
    it->bytes += r.bytes;
  }
}

// Every GEMM's FP8 state (scales, amax histories) of `module` moved to meta, as the data it
// scales.
void fp8_state_to_meta(torch::nn::Module& module) {
  for (const auto& child : module.modules(/*include_self=*/true)) {
    auto* sharded = dynamic_cast<ShardedModule*>(child.get());
    if (sharded == nullptr) continue;
    for (const ShardedModule::Fp8Gemm& gemm : sharded->fp8_gemms()) {
      fp8::GemmMeta& m = *gemm.meta;
      for (at::Tensor* t : {&m.fwd_scale, &m.fwd_scale_inv, &m.fwd_amax_history, &m.bwd_scale,
                            &m.bwd_scale_inv, &m.bwd_amax_history}) {
        if (t->defined()) *t = at::empty(t->sizes(), t->options().device(at::kMeta));
      }
    }
  }
}

// The forward of the stack on this rank's piece of a [batch, seqlen, hidden] input laid out as
// the layer's input constraint says (under FP8 autocast when asked; leaving it reduces amaxes).
at::Tensor forward(const PlanOptions& o, std::vector<TransformerLayer>& layers,
                   const at::Tensor& global) {
  std::optional<Fp8Autocast> autocast;
  if (o.fp8()) autocast.emplace(true, *o.fp8());
  const DeviceMesh* mesh = current_mesh();
  if (mesh == nullptr) {
    at::Tensor x = global;
    for (TransformerLayer& layer : layers) x = layer(x);
    return x;
  }
  const LogicalAxes axes = {axis::kBatch,
                            axis::seqlen(o.layer().self_attention().enable_sequence_parallel()),
                            axis::kHidden};
  const auto spec = resolve_logical_axes(axes);
  const std::vector<Placement> placements =
      spec ? placements_for(*spec, *mesh)
           : std::vector<Placement>(o.mesh_shape().size(), Replicate{});
  DTensor x = DTensor::distribute(global, *mesh, placements);
  for (TransformerLayer& layer : layers) x = layer(x);
  return x.to_local();
}

// One rank's step, on meta tensors in the simulated world this thread is in: forward, then
// backward with the data-parallel gradients summed in buckets, then the optimizer's step.
void run_step(const PlanStepOptions& o, const PlannedStep& step, Plan& plan) {
  AllocationCounter counter(c10::DeviceType::Meta);
  std::optional<DeviceMesh> mesh;
  std::optional<MeshScope> mesh_scope;
  if (!o.mesh_shape.empty()) {
    mesh.emplace(o.mesh_shape, o.mesh_axes);
    mesh_scope.emplace(*mesh);
  }
  std::vector<std::shared_ptr<torch::nn::Module>> modules;
  {
    MetaParameterScope meta;
    modules = step.build();
  }
  std::vector<at::Tensor> params;
  for (const auto& module : modules) {
    fp8_state_to_meta(*module);
    for (const at::Tensor& p : module->parameters()) {
      params.push_back(p);
      plan.parameters += p.numel();
      plan.parameter_bytes += bytes_of(p);
    }
    for (const at::Tensor& b : module->buffers()) plan.buffer_bytes += bytes_of(b);
  }
  const int64_t base = counter.live_bytes();
  counter.reset_peak();
  std::optional<GradientBuckets> buckets;
  if (o.bucket_bytes > 0 && mesh) buckets.emplace(o.bucket_bytes);
  for (int64_t micro = 0; micro < step.micro_batches; ++micro) {
    at::Tensor out;
    {
      CommTrace trace;
      out = step.forward(micro);
      const auto records = trace.records();
      plan.forward.insert(plan.forward.end(), records.begin(), records.end());
    }
    if (micro == 0) plan.activation_bytes = counter.live_bytes() - base - bytes_of(out);
    CommTrace trace;
    torch::autograd::backward({out}, {at::empty(out.sizes(), out.options())});
    out = at::Tensor();
    if (buckets && micro + 1 == step.micro_batches) buckets->finish();
    const auto records = trace.records();
    plan.backward.insert(plan.backward.end(), records.begin(), records.end());
  }
  for (const at::Tensor& p : params) plan.gradient_bytes += bytes_of(p.grad());
  plan.step_transient_bytes = counter.peak_bytes() - base;
  if (step.optimizer_step) {
    const int64_t before = counter.live_bytes();
    counter.reset_peak();
    CommTrace trace;
    step.optimizer_step();
    plan.optimizer = trace.records();
    plan.optimizer_bytes = counter.live_bytes() - before;
    plan.optimizer_step_bytes = counter.peak_bytes() - base - plan.optimizer_bytes;
  }
}

std::string mib(int64_t bytes) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(bytes >= (int64_t{1} << 30) ? 2 : 1)
     << (bytes >= (int64_t{1} << 30) ? static_cast<double>(bytes) / (1 << 30)
                                     : static_cast<double>(bytes) / (1 << 20))
     << (bytes >= (int64_t{1} << 30) ? " GiB" : " MiB");
  return os.str();
}

}  // namespace

Plan plan_step(const PlanStepOptions& options, const PlannedStep& step) {
  TE_CHECK(options.mesh_shape.size() == options.mesh_axes.size(),
           "plan: ", options.mesh_shape.size(), " mesh dims but ", options.mesh_axes.size(),
           " axis names; give one name per dim");
  TE_CHECK(options.bucket_bytes >= 0, "plan: bucket_bytes must be 0 (no buckets) or positive");
  TE_CHECK(step.build && step.forward, "plan_step: the PlannedStep needs build and forward");
  TE_CHECK(step.micro_batches >= 1, "plan_step: micro_batches must be at least 1, got ",
           step.micro_batches);
  ensure_meta_kernels();
  // The plan's dropouts draw nothing but count as calls of this thread's stream: the caller's
  // stream is put back, so planning mid-run leaves its masks as they were.
  struct KeepStream {
    RngState saved = rng_state();
    ~KeepStream() { set_rng_state(saved); }
  } keep_stream;
  const auto start = std::chrono::steady_clock::now();
  Plan result;
  result.mesh_shape = options.mesh_shape;
  result.mesh_axes = options.mesh_axes;
  for (int64_t s : options.mesh_shape) {
    TE_CHECK(s >= 1, "plan: mesh dim of size ", s, "; every dim needs at least one rank");
    result.world_size *= s;
  }
  TE_CHECK(options.rank >= 0 && options.rank < result.world_size, "plan: rank ", options.rank,
           " is not one of the mesh's ", result.world_size, " ranks");
  result.rank = options.rank;
  // The caller's rules and MeshResource reach the step (the same thread), as in a real run.
  run_simulated_rank(static_cast<int>(result.world_size), options.rank,
                     [&] { run_step(options, step, result); });
  result.peak_bytes = result.parameter_bytes + result.buffer_bytes + result.optimizer_bytes +
                      std::max(result.step_transient_bytes, result.optimizer_step_bytes);
  summarise("forward", result.forward, result.collectives);
  summarise("backward", result.backward, result.collectives);
  summarise("optimizer", result.optimizer, result.collectives);
  result.planning_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

Plan plan(const PlanOptions& options) {
  check(options);
  std::vector<TransformerLayer> layers;
  at::Tensor global;
  PlannedStep step;
  step.build = [&] {
    std::vector<std::shared_ptr<torch::nn::Module>> modules;
    for (int64_t i = 0; i < options.layers(); ++i) {
      layers.emplace_back(options.layer());
      if (options.dtype() != at::kFloat) layers.back()->to(options.dtype());
      modules.push_back(layers.back().ptr());
    }
    // The input a data loader hands the step: made before the step's bytes are counted.
    global = at::empty({options.batch(), options.seqlen(), options.layer().hidden_size()},
                       at::TensorOptions().device(at::kMeta).dtype(options.dtype()));
    return modules;
  };
  step.forward = [&](int64_t) { return forward(options, layers, global); };
  PlanStepOptions where;
  where.mesh_shape = options.mesh_shape();
  where.mesh_axes = options.mesh_axes();
  where.rank = options.rank();
  where.bucket_bytes = options.bucket_bytes();
  Plan result = plan_step(where, step);
  // The optimizer's state counted, not stepped: torch::optim::Adam's two moments.
  result.optimizer_bytes = options.optimizer() == "adam" ? 2 * result.parameter_bytes : 0;
  result.peak_bytes += result.optimizer_bytes;
  return result;
}

std::string Plan::table() const {
  std::ostringstream os;
  os << "mesh ";
  if (mesh_shape.empty()) os << "(one process)";
  for (std::size_t i = 0; i < mesh_shape.size(); ++i) {
    os << (i ? " x " : "") << mesh_axes[i] << "=" << mesh_shape[i];
  }
  os << ": " << world_size << " rank" << (world_size == 1 ? "" : "s") << ", planned for rank "
     << rank << "\n";
  os << "per rank:\n";
  const auto row = [&](const char* what, int64_t bytes) {
    os << "  " << std::left << std::setw(38) << what << std::right << std::setw(12) << mib(bytes)
       << "\n";
  };
  os << "  parameters                            " << std::setw(12) << parameters << " elements\n";
  row("parameter bytes", parameter_bytes);
  row("gradient bytes", gradient_bytes);
  row("optimizer state", optimizer_bytes);
  row("buffers (FP8 scales, amax histories)", buffer_bytes);
  row("activations kept for backward", activation_bytes);
  row("forward/backward peak (grads incl.)", step_transient_bytes);
  if (optimizer_step_bytes > 0) row("optimizer step peak (grads incl.)", optimizer_step_bytes);
  row("step peak (all of the above)", peak_bytes);
  os << "collectives per step:\n";
  if (collectives.empty()) os << "  none\n";
  for (const PlannedCollectives& c : collectives) {
    os << "  " << std::left << std::setw(10) << c.phase << std::setw(15) << to_string(c.kind)
       << std::setw(12) << ("'" + c.mesh_axis + "'") << std::right << std::setw(6) << c.count
       << " x  " << std::setw(12) << mib(c.bytes) << " (" << c.bytes << " bytes)\n";
  }
  return os.str();
}

std::string Plan::to_json() const {
  nlohmann::json j;
  j["world_size"] = world_size;
  j["rank"] = rank;
  j["mesh"] = nlohmann::json::array();
  for (std::size_t i = 0; i < mesh_shape.size(); ++i) {
    j["mesh"].push_back({{"axis", mesh_axes[i]}, {"size", mesh_shape[i]}});
  }
  j["memory"] = {{"parameters", parameters},
                 {"parameter_bytes", parameter_bytes},
                 {"gradient_bytes", gradient_bytes},
                 {"optimizer_bytes", optimizer_bytes},
                 {"buffer_bytes", buffer_bytes},
                 {"activation_bytes", activation_bytes},
                 {"step_transient_bytes", step_transient_bytes},
                 {"optimizer_step_bytes", optimizer_step_bytes},
                 {"peak_bytes", peak_bytes}};
  j["collectives"] = nlohmann::json::array();
  for (const PlannedCollectives& c : collectives) {
    j["collectives"].push_back({{"phase", c.phase},
                                {"kind", to_string(c.kind)},
                                {"mesh_axis", c.mesh_axis},
                                {"count", c.count},
                                {"bytes", c.bytes}});
  }
  j["planning_seconds"] = planning_seconds;
  return j.dump(2);
}

}  // namespace te::nn
