#include "te/nn/sharded.h"

#include <ATen/ATen.h>

#include <torch/csrc/autograd/grad_mode.h>
#include <algorithm>

#include "te/distributed/mesh.h"
#include "te/error.h"
#include "te/nn/init.h"
#include "te/sharding/context.h"

namespace te::nn {

namespace {

// A rank's piece of a whole parameter in storage of its own: a piece of dim 0 is a view of the
// whole tensor's storage, which would keep every byte of the parameter alive on every rank
// (tests/nn/test_planner.cpp measures what a rank holds).
at::Tensor own_piece(const at::Tensor& piece) {
  if (piece.storage().nbytes() == piece.numel() * static_cast<int64_t>(piece.element_size())) {
    return piece;
  }
  return piece.clone(at::MemoryFormat::Contiguous);
}

}  // namespace

at::Tensor ShardedModule::register_sharded(torch::nn::Module& self, const std::string& name,
                                           at::Tensor full, LogicalAxes axes) {
  TE_CHECK(static_cast<int64_t>(axes.size()) == full.dim(), self.name(), ": parameter '", name,
           "' has ", full.dim(), " dims but ", axes.size(), " logical axes ", to_string(axes),
           "; give one (or std::nullopt) per dim");
  // Under a MetaParameterScope a module's constant initial values (zeros, ones) become meta too.
  if (meta_parameters() && !full.is_meta()) {
    full = at::empty(full.sizes(), full.options().device(at::kMeta));
  }
  ParameterLayout layout;
  layout.axes = axes;
  layout.global_shape.assign(full.sizes().begin(), full.sizes().end());
  if (auto it = layouts_.find(name); it != layouts_.end() && it->second.mesh) {
    // A clone: keep the original's layout whatever is in scope now.
    layout.mesh = it->second.mesh;
    layout.placements = it->second.placements;
  } else if (const DeviceMesh* mesh = current_mesh()) {
    validate_logical_axes(axes);
    if (auto wanted = resolve_placements(axes, *mesh)) {
      layout.mesh = *mesh;
      layout.placements = std::move(*wanted);
    }
  } else {
    validate_logical_axes(axes);
  }
  at::Tensor value = full;
  if (layout.mesh) {
    value = own_piece(DTensor::distribute(full, *layout.mesh, layout.placements).to_local());
  }
  layouts_[name] = layout;
  return self.register_parameter(name, value);
}

namespace {

// torch::nn::Module keeps its parameters in a protected dictionary with no public way to remove
// one; a member pointer named through a derived class reaches it.
struct ParameterDict : torch::nn::Module {
  static void erase(torch::nn::Module& m, const std::string& name) {
    (m.*(&ParameterDict::parameters_)).erase(name);
  }
};

}  // namespace

void ShardedModule::release_parameter(torch::nn::Module& self, const std::string& name) {
  TE_CHECK(dynamic_cast<ShardedModule*>(&self) == this, "release_parameter: ", self.name(),
           " is another module than the one asked to release '", name, "' (pass it itself)");
  TE_CHECK(self.named_parameters(/*recurse=*/false).contains(name), self.name(), ": no parameter '",
           name, "' to release");
  forget_member(name);
  ParameterDict::erase(self, name);
  layouts_.erase(name);
}

void ShardedModule::forget_member(const std::string& name) {
  TE_FAIL("release_parameter: this module keeps its parameter '", name,
          "' (only kernels and embedding tables can be held in another form)");
}

void ShardedModule::hold_blocks(torch::nn::Module& self, const std::string& name, HeldBlocks held) {
  const std::string what = "'" + name + "' of " + self.name();
  TE_CHECK(held.matrix != nullptr, "hold_blocks: no matrix for ", what);
  held.matrix->check(what);
  const auto layout = layouts_.find(name);
  TE_CHECK(layout != layouts_.end(), "hold_blocks: ", self.name(), " has no parameter '", name,
           "'");
  TE_CHECK(!layout->second.mesh || layout->second.mesh->size() == 1, "hold_blocks: ", what,
           " is sharded on ", layout->second.mesh ? layout->second.mesh->to_string() : "",
           "; weights held in GGUF blocks serve on one process (load them dequantized to shard)");
  const std::vector<int64_t>& shape = layout->second.global_shape;
  const std::size_t in = held.experts > 0 ? 1 : 0;  // the dim the matrix's columns are
  int64_t rest = 1;
  for (std::size_t d = in + 1; d < shape.size(); ++d) rest *= shape[d];
  const bool fits = shape.size() >= in + 2 &&
                    (held.experts > 0 ? held.transposed && shape[0] == held.experts &&
                                            held.matrix->cols == shape[1] &&
                                            held.matrix->rows == held.experts * rest
                     : held.transposed ? held.matrix->cols == shape[0] && held.matrix->rows == rest
                                       : shape.size() == 2 && held.matrix->rows == shape[0] &&
                                             held.matrix->cols == shape[1]);
  TE_CHECK(fits, "hold_blocks: ", what, " is ", at::IntArrayRef(shape), " but the blocks hold a [",
           held.matrix->rows, ", ", held.matrix->cols, "] matrix",
           held.transposed ? " (the parameter transposed)" : "");
  held.shape = shape;
  release_parameter(self, name);
  blocks_[name] = std::move(held);
}

const ShardedModule::HeldBlocks* ShardedModule::held_blocks(const std::string& name) const {
  const auto it = blocks_.find(name);
  return it == blocks_.end() ? nullptr : &it->second;
}

DTensor ShardedModule::as_dtensor(const std::string& name, const at::Tensor& local,
                                  const DeviceMesh& mesh) const {
  TE_CHECK(local.defined() && layouts_.count(name) != 0, "parameter '", name,
           "' was released: its weights are held in FP8 (freeze_fp8_weights) or in GGUF blocks "
           "(te::hf loads), which serve through the module's at::Tensor forward on one process");
  const ParameterLayout& layout = layouts_.at(name);
  if (layout.mesh) {
    TE_CHECK(*layout.mesh == mesh, "parameter '", name, "' is sharded on ",
             layout.mesh->to_string(), " but the input lives on another mesh (", mesh.to_string(),
             "); build the module under the input's mesh");
    return DTensor::from_local(local, mesh, layout.placements, layout.global_shape);
  }
  return DTensor::from_local(
      local, mesh, std::vector<Placement>(static_cast<std::size_t>(mesh.ndim()), Replicate{}),
      layout.global_shape);
}

bool ShardedModule::is_sharded() const {
  for (const auto& [name, layout] : layouts_) {
    if (layout.mesh && layout.mesh->size() > 1) {
      for (const Placement& p : layout.placements) {
        if (is_shard(p)) return true;
      }
    }
  }
  return false;
}

void ShardedModule::shard_own_parameters(torch::nn::Module& self, const DeviceMesh& mesh) {
  torch::NoGradGuard no_grad;
  for (auto& [name, layout] : layouts_) {
    if (layout.mesh) {
      TE_CHECK(*layout.mesh == mesh, self.name(), ": parameter '", name,
               "' is already sharded on another mesh; gather_module first");
      continue;
    }
    auto wanted = resolve_placements(layout.axes, mesh);
    if (!wanted) continue;
    const std::vector<Placement> placements = std::move(*wanted);
    at::Tensor param = self.named_parameters(/*recurse=*/false)[name];
    param.set_data(own_piece(DTensor::distribute(param.detach(), mesh, placements).to_local()));
    layout.mesh = mesh;
    layout.placements = placements;
  }
}

std::shared_ptr<fp8::GemmMeta> ShardedModule::register_fp8_gemm(torch::nn::Module& self,
                                                                const std::string& prefix) {
  auto meta = fp8::GemmMeta::make(prefix);
  meta->fwd_scale = self.register_buffer(prefix + "fp8_fwd_scale", meta->fwd_scale);
  meta->fwd_scale_inv = self.register_buffer(prefix + "fp8_fwd_scale_inv", meta->fwd_scale_inv);
  meta->fwd_amax_history =
      self.register_buffer(prefix + "fp8_fwd_amax_history", meta->fwd_amax_history);
  meta->bwd_scale = self.register_buffer(prefix + "fp8_bwd_scale", meta->bwd_scale);
  meta->bwd_scale_inv = self.register_buffer(prefix + "fp8_bwd_scale_inv", meta->bwd_scale_inv);
  meta->bwd_amax_history =
      self.register_buffer(prefix + "fp8_bwd_amax_history", meta->bwd_amax_history);
  // The state lives as long as the module holds it (a member); a clone binds its own.
  meta->training = [&self] { return self.is_training(); };
  return meta;
}

void ShardedModule::gather_own_parameters(torch::nn::Module& self) {
  torch::NoGradGuard no_grad;
  for (auto& [name, layout] : layouts_) {
    if (!layout.mesh) continue;
    at::Tensor param = self.named_parameters(/*recurse=*/false)[name];
    param.set_data(
        DTensor::from_local(param.detach(), *layout.mesh, layout.placements, layout.global_shape)
            .full_tensor());
    layout.mesh.reset();
    layout.placements.clear();
  }
}

namespace {
template <typename Fn>
void for_each_sharded(torch::nn::Module& module, Fn fn) {
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    if (auto* sharded = dynamic_cast<ShardedModule*>(item.value().get()))
      fn(*item.value(), *sharded);
  }
}
}  // namespace

void shard_module(torch::nn::Module& module, const DeviceMesh& mesh) {
  for_each_sharded(
      module, [&](torch::nn::Module& m, ShardedModule& s) { s.shard_own_parameters(m, mesh); });
}

void gather_module(torch::nn::Module& module) {
  for_each_sharded(module,
                   [](torch::nn::Module& m, ShardedModule& s) { s.gather_own_parameters(m); });
}

std::string ShardingReport::to_string() const {
  if (ok()) return "sharding: no problems\n";
  std::string out = "sharding problems:\n";
  for (const std::string& u : uneven) out += "  uneven: " + u + "\n";
  for (const std::string& u : unmatched) out += "  no rule: " + u + "\n";
  return out;
}

ShardingReport check_sharding(const torch::nn::Module& module) {
  ShardingReport report;
  static const AxisRules kNone;
  const AxisRules* in_effect = rules_in_effect();
  const AxisRules* rules = in_effect != nullptr ? in_effect : &kNone;
  const DeviceMesh* mesh = current_mesh();
  for (const auto& [name, layout] : named_parameter_layouts(module)) {
    for (std::size_t d = 0; d < layout.axes.size(); ++d) {
      const auto& axis = layout.axes[d];
      if (!axis || rules->empty()) continue;
      const bool named = std::any_of(rules->begin(), rules->end(),
                                     [&](const AxisRule& r) { return r.logical == *axis; });
      if (!named) {
        report.unmatched.push_back(name + " dim " + std::to_string(d) + ": logical axis '" + *axis +
                                   "'");
      }
    }
    std::optional<DeviceMesh> on;
    std::vector<Placement> placements;
    if (layout.mesh) {
      on = layout.mesh;
      placements = layout.placements;
    } else if (mesh != nullptr) {
      if (auto wanted = resolve_placements(layout.axes, *mesh)) {
        on = *mesh;
        placements = std::move(*wanted);
      }
    }
    if (!on) continue;
    for (std::size_t d = 0; d < layout.global_shape.size(); ++d) {
      int64_t parts = 1;
      std::string axes;
      for (std::size_t m = 0; m < placements.size(); ++m) {
        if (is_shard(placements[m], static_cast<int64_t>(d))) {
          parts *= on->size(static_cast<int64_t>(m));
          axes += (axes.empty() ? "'" : ", '") + on->axis_names()[m] + "'";
        }
      }
      if (layout.global_shape[d] % parts != 0) {
        report.uneven.push_back(name + " dim " + std::to_string(d) + " ('" +
                                layout.axes[d].value_or("?") + "') of size " +
                                std::to_string(layout.global_shape[d]) + " over mesh axes " + axes +
                                " (" + std::to_string(parts) + " ranks)");
      }
    }
  }
  return report;
}

void validate_sharding(const torch::nn::Module& module) {
  const ShardingReport report = check_sharding(module);
  TE_CHECK(report.ok(), module.name(), ": ", report.to_string(),
           "make each sharded dim a multiple of its ranks and give every logical axis a rule "
           "(name= pins it replicated)");
}

std::map<std::string, ParameterLayout> named_parameter_layouts(const torch::nn::Module& module) {
  std::map<std::string, ParameterLayout> out;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    const auto* sharded = dynamic_cast<const ShardedModule*>(item.value().get());
    if (sharded == nullptr) continue;
    for (const auto& [name, layout] : sharded->parameter_layouts()) {
      out[item.key().empty() ? name : item.key() + "." + name] = layout;
    }
  }
  return out;
}

void set_parameter_from_global(torch::nn::Module& module, const std::string& name,
                               const at::Tensor& global) {
  const auto layouts = named_parameter_layouts(module);
  const auto it = layouts.find(name);
  TE_CHECK(it != layouts.end(), module.name(), " has no te::nn parameter '", name,
           "'; named_parameters() lists its parameters");
  const ParameterLayout& layout = it->second;
  TE_CHECK(
      std::vector<int64_t>(global.sizes().begin(), global.sizes().end()) == layout.global_shape,
      "parameter '", name, "' has global shape ", at::IntArrayRef(layout.global_shape),
      " but the value given has shape ", global.sizes());
  at::Tensor piece = global;
  if (layout.mesh) piece = DTensor::distribute(global, *layout.mesh, layout.placements).to_local();
  torch::NoGradGuard no_grad;
  module.named_parameters()[name].copy_(piece);
}

std::map<std::string, LogicalAxes> named_parameter_axes(const torch::nn::Module& module) {
  std::map<std::string, LogicalAxes> out;
  for (const auto& [name, layout] : named_parameter_layouts(module)) out[name] = layout.axes;
  return out;
}

}  // namespace te::nn
