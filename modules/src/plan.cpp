#include "te/nn/plan.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <iomanip>
#include <sstream>

#include "te/distributed/dtensor.h"
#include "te/distributed/gradients.h"
#include "te/distributed/mesh.h"
#include "te/error.h"
#include "te/nn/init.h"
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
  TE_CHECK(o.mesh_shape().size() == o.mesh_axes().size(), "plan: ", o.mesh_shape().size(),
           " mesh dims but ", o.mesh_axes().size(), " axis names; give one name per dim");
  TE_CHECK(o.optimizer() == "adam" || o.optimizer() == "sgd", "plan: optimizer '", o.optimizer(),
           "' is not adam or sgd");
  TE_CHECK(o.dtype() == at::kFloat || o.dtype() == at::kBFloat16 || o.dtype() == at::kHalf,
           "plan: dtype ", c10::toString(o.dtype()), " is not float32, bfloat16 or float16");
  TE_CHECK(o.bucket_bytes() >= 0, "plan: bucket_bytes must be 0 (no buckets) or positive");
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

// The stack on meta tensors: parameters from the initialisers, and every GEMM's FP8 state
// (scales, amax histories) moved to meta too, as the data it scales.
std::vector<TransformerLayer> build_stack(const PlanOptions& o) {
  std::vector<TransformerLayer> layers;
  MetaParameterScope meta;
  for (int64_t i = 0; i < o.layers(); ++i) {
    layers.emplace_back(o.layer());
    if (o.dtype() != at::kFloat) layers.back()->to(o.dtype());
    for (const auto& child : layers.back()->modules()) {
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
  return layers;
}

// The forward of the stack on this rank's piece of a [batch, seqlen, hidden] input laid out as
// the layer's input constraint says (under FP8 autocast when asked; leaving it reduces amaxes).
at::Tensor forward(const PlanOptions& o, const std::optional<DeviceMesh>& mesh,
                   std::vector<TransformerLayer>& layers, const at::Tensor& global) {
  std::optional<Fp8Autocast> autocast;
  if (o.fp8()) autocast.emplace(true, *o.fp8());
  if (!mesh) {
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
// backward with the data-parallel gradients summed in buckets (as te-encoder trains).
void run_step(const PlanOptions& o, Plan& plan) {
  AllocationCounter counter(c10::DeviceType::Meta);
  std::optional<DeviceMesh> mesh;
  std::optional<MeshScope> mesh_scope;
  if (!o.mesh_shape().empty()) {
    mesh.emplace(o.mesh_shape(), o.mesh_axes());
    mesh_scope.emplace(*mesh);
  }
  std::vector<TransformerLayer> layers = build_stack(o);
  std::vector<at::Tensor> params;
  for (const TransformerLayer& layer : layers) {
    for (const at::Tensor& p : layer->parameters()) {
      params.push_back(p);
      plan.parameters += p.numel();
      plan.parameter_bytes += bytes_of(p);
    }
    for (const at::Tensor& b : layer->buffers()) plan.buffer_bytes += bytes_of(b);
  }
  plan.optimizer_bytes = o.optimizer() == "adam" ? 2 * plan.parameter_bytes : 0;

  const at::Tensor global = at::empty({o.batch(), o.seqlen(), o.layer().hidden_size()},
                                      at::TensorOptions().device(at::kMeta).dtype(o.dtype()));
  const int64_t base = counter.live_bytes();
  counter.reset_peak();
  at::Tensor out;
  {
    CommTrace trace;
    out = forward(o, mesh, layers, global);
    plan.forward = trace.records();
  }
  plan.activation_bytes = counter.live_bytes() - base - bytes_of(out);
  {
    CommTrace trace;
    std::optional<GradientBuckets> buckets;
    if (o.bucket_bytes() > 0 && mesh) buckets.emplace(o.bucket_bytes());
    torch::autograd::backward({out}, {at::empty(out.sizes(), out.options())});
    if (buckets) buckets->finish();
    plan.backward = trace.records();
  }
  for (const at::Tensor& p : params) plan.gradient_bytes += bytes_of(p.grad());
  plan.step_transient_bytes = counter.peak_bytes() - base;
  plan.peak_bytes =
      plan.parameter_bytes + plan.buffer_bytes + plan.optimizer_bytes + plan.step_transient_bytes;
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

Plan plan(const PlanOptions& options) {
  check(options);
  ensure_meta_kernels();
  const auto start = std::chrono::steady_clock::now();
  Plan result;
  result.mesh_shape = options.mesh_shape();
  result.mesh_axes = options.mesh_axes();
  for (int64_t s : options.mesh_shape()) {
    TE_CHECK(s >= 1, "plan: mesh dim of size ", s, "; every dim needs at least one rank");
    result.world_size *= s;
  }
  TE_CHECK(options.rank() >= 0 && options.rank() < result.world_size, "plan: rank ", options.rank(),
           " is not one of the mesh's ", result.world_size, " ranks");
  result.rank = options.rank();
  // The caller's rules and MeshResource reach the step (the same thread), as in a real run.
  run_simulated_rank(static_cast<int>(result.world_size), options.rank(),
                     [&] { run_step(options, result); });
  summarise("forward", result.forward, result.collectives);
  summarise("backward", result.backward, result.collectives);
  result.planning_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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
  row("step peak (all of the above)", peak_bytes);
  os << "collectives per step:\n";
  if (collectives.empty()) os << "  none\n";
  for (const PlannedCollectives& c : collectives) {
    os << "  " << std::left << std::setw(9) << c.phase << std::setw(15) << to_string(c.kind)
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
