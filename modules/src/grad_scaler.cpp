// te::optim::GradScaler (see grad_scaler.h).

#include "te/optim/grad_scaler.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "te/error.h"
#include "te/nn/sharded.h"

namespace te::optim {

GradScaler::GradScaler(GradScalerOptions options)
    : options_(options), scale_(options.init_scale()) {
  TE_CHECK(std::isfinite(scale_) && scale_ > 0, "GradScaler: init_scale ", scale_,
           " is not positive and finite");
  TE_CHECK(options_.growth_factor() > 1, "GradScaler: growth_factor ", options_.growth_factor(),
           " is not above 1");
  TE_CHECK(options_.backoff_factor() > 0 && options_.backoff_factor() < 1,
           "GradScaler: backoff_factor ", options_.backoff_factor(), " is not in (0, 1)");
  TE_CHECK(options_.growth_interval() >= 1, "GradScaler: growth_interval ",
           options_.growth_interval(), " is not positive");
}

at::Tensor GradScaler::scale(const at::Tensor& loss) const { return loss * scale_; }

bool GradScaler::unscale(torch::nn::Module& module) {
  if (unscaled_) return !found_inf_;
  const double inverse = 1.0 / scale_;
  bool found = false;
  for (auto& p : module.parameters(/*recurse=*/true)) {
    if (!p.grad().defined()) continue;
    at::Tensor g = p.mutable_grad().detach();
    g.mul_(inverse);
    if (!found && g.numel() > 0 && !at::isfinite(g).all().item<bool>()) found = true;
  }
  // Every rank must agree: one all-reduce (max) over the whole of each mesh the parameters are
  // on, in the same order on every rank (by the mesh's name).
  std::map<std::string, DeviceMesh> meshes;
  for (const auto& [name, layout] : te::nn::named_parameter_layouts(module)) {
    if (layout.mesh && layout.mesh->size() > 1)
      meshes.emplace(layout.mesh->to_string(), *layout.mesh);
  }
  at::Tensor flag = at::full({}, found ? 1.0 : 0.0, at::kDouble);
  for (const auto& [name, mesh] : meshes) {
    std::vector<int64_t> dims(static_cast<std::size_t>(mesh.ndim()));
    for (int64_t d = 0; d < mesh.ndim(); ++d) dims[static_cast<std::size_t>(d)] = d;
    flag = mesh.all_reduce(flag, ReduceOp::kMax, dims);
  }
  found_inf_ = flag.item<double>() > 0;
  unscaled_ = true;
  return !found_inf_;
}

void GradScaler::restore(double scale, int64_t growth_tracker, int64_t skipped_steps) {
  TE_CHECK(std::isfinite(scale) && scale > 0, "GradScaler::restore: scale ", scale,
           " is not positive and finite");
  TE_CHECK(growth_tracker >= 0 && skipped_steps >= 0, "GradScaler::restore: growth_tracker ",
           growth_tracker, " and skipped_steps ", skipped_steps, " must not be negative");
  scale_ = scale;
  growth_tracker_ = growth_tracker;
  skipped_ = skipped_steps;
  unscaled_ = found_inf_ = false;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer, torch::nn::Module& module) {
  if (!unscale(module)) {
    ++skipped_;
    return false;
  }
  optimizer.step();
  return true;
}

void GradScaler::update() {
  TE_CHECK(unscaled_,
           "GradScaler: update() without unscale() or step() since the last update; "
           "call step(optimizer, module) after backward");
  if (found_inf_) {
    scale_ *= options_.backoff_factor();
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval()) {
    const double grown = scale_ * options_.growth_factor();
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  }
  unscaled_ = found_inf_ = false;
}

}  // namespace te::optim
