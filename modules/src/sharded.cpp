#include "te/nn/sharded.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "te/error.h"
#include "te/sharding/context.h"

namespace te::nn {

at::Tensor ShardedModule::register_sharded(torch::nn::Module& self, const std::string& name,
                                           at::Tensor full, LogicalAxes axes) {
  TE_CHECK(static_cast<int64_t>(axes.size()) == full.dim(), self.name(), ": parameter '", name,
           "' has ", full.dim(), " dims but ", axes.size(), " logical axes ", to_string(axes),
           "; give one (or std::nullopt) per dim");
  ParameterLayout layout;
  layout.axes = axes;
  layout.global_shape.assign(full.sizes().begin(), full.sizes().end());
  if (auto it = layouts_.find(name); it != layouts_.end() && it->second.mesh) {
    // A clone: keep the original's layout whatever is in scope now.
    layout.mesh = it->second.mesh;
    layout.placements = it->second.placements;
  } else if (const DeviceMesh* mesh = current_mesh()) {
    validate_logical_axes(axes);
    if (auto spec = resolve_logical_axes(axes)) {
      layout.mesh = *mesh;
      layout.placements = placements_for(*spec, *mesh);
    }
  } else {
    validate_logical_axes(axes);
  }
  at::Tensor value = full;
  if (layout.mesh) {
    value = DTensor::distribute(full, *layout.mesh, layout.placements).to_local();
  }
  layouts_[name] = layout;
  return self.register_parameter(name, value);
}

DTensor ShardedModule::as_dtensor(const std::string& name, const at::Tensor& local,
                                  const DeviceMesh& mesh) const {
  const ParameterLayout& layout = layouts_.at(name);
  if (layout.mesh) {
    TE_CHECK(*layout.mesh == mesh, "parameter '", name, "' is sharded on ", layout.mesh->to_string(),
             " but the input lives on another mesh (", mesh.to_string(),
             "); build the module under the input's mesh");
    return DTensor::from_local(local, mesh, layout.placements, layout.global_shape);
  }
  return DTensor::from_local(local, mesh,
                             std::vector<Placement>(static_cast<std::size_t>(mesh.ndim()),
                                                    Replicate{}),
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
  TE_CHECK(std::vector<int64_t>(global.sizes().begin(), global.sizes().end()) ==
               layout.global_shape,
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
