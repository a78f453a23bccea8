#pragma once

// Dynamic loss scaling for float16 training on a mesh, as torch.amp.GradScaler does it: the loss
// multiplied by a scale before backward, the gradients divided by it before the step, a step
// with an inf or nan gradient skipped (and counted) and the scale backed off, the scale grown
// after `growth_interval` finite steps in a row (torch/amp/grad_scaler.py and
// _amp_update_scale_'s rule). On a mesh, whether a gradient is non-finite is all-reduced over
// every rank the parameters live on, so every rank skips the same steps (a tensor-parallel shard
// can overflow on one rank alone).
//
// Example:
//   te::optim::GradScaler scaler;
//   scaler.scale(loss).backward();
//   const bool stepped = scaler.step(optimizer, *model);  // unscales, skips on inf/nan
//   scaler.update();

#include <ATen/ATen.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>

namespace te::optim {

struct GradScalerOptions {
  TORCH_ARG(double, init_scale) = 65536.0;
  TORCH_ARG(double, growth_factor) = 2.0;
  TORCH_ARG(double, backoff_factor) = 0.5;
  TORCH_ARG(int64_t, growth_interval) = 2000;
};

class GradScaler {
 public:
  /// te::Error naming the option for a scale not positive and finite, growth_factor <= 1,
  /// backoff_factor outside (0, 1), or growth_interval < 1.
  explicit GradScaler(GradScalerOptions options = {});

  /// loss x the current scale.
  at::Tensor scale(const at::Tensor& loss) const;
  /// Divides every gradient of `module` by the scale (once per step) and returns whether all of
  /// them are finite on every rank. Collective over the meshes of the parameters.
  bool unscale(torch::nn::Module& module);
  /// unscale (unless done this step), then optimizer.step() when every gradient is finite;
  /// returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer, torch::nn::Module& module);
  /// The scale for the next step: backed off after a skipped step, grown after growth_interval
  /// finite steps in a row. te::Error when no step or unscale ran since the last update.
  void update();

  double get_scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  /// Steps skipped for a non-finite gradient, since construction.
  int64_t skipped_steps() const { return skipped_; }
  /// Puts back the scale, growth tracker and skipped-step count a checkpoint kept (between
  /// steps): te::Error naming the value for a scale not positive and finite or a negative count.
  void restore(double scale, int64_t growth_tracker, int64_t skipped_steps);

 private:
  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0, skipped_ = 0;
  bool unscaled_ = false, found_inf_ = false;
};

}  // namespace te::optim
