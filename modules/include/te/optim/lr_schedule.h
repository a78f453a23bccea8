#pragma once

// Learning-rate schedules: linear warmup, then a stable phase, then a decay (linear, sqrt or
// cosine) to a floor; warmup-stable-decay (WSD) when the decay is a fraction of the run, warmup +
// decay when it is the rest. The factor of each step is torchtitan's
// (torchtitan/components/lr_scheduler.py, linear_warmup_stable_decay, at 0e13811), applied as
// torch.optim.lr_scheduler.LambdaLR applies a factor: optimizer step k (from 0) runs at
// base lr x factor(k).
//
// Example:
//   te::optim::LrSchedule schedule(te::optim::LrScheduleOptions(/*steps=*/1000).warmup_steps(100)
//                                      .decay_type("cosine").lr_min(0.1));
//   for (int64_t step = 0; step < 1000; ++step) {
//     schedule.apply(optimizer, base_lr, step);
//     ... loss.backward(); optimizer.step();
//   }

#include <torch/arg.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <optional>
#include <string>

namespace te::optim {

struct LrScheduleOptions {
  explicit LrScheduleOptions(int64_t steps) : steps_(steps) {}
  /// The run's optimizer steps.
  TORCH_ARG(int64_t, steps);
  /// Steps of linear warmup: step k < warmup_steps runs at (k + 1) / (warmup_steps + 1).
  TORCH_ARG(int64_t, warmup_steps) = 0;
  /// The decay's share of `steps` (rounded: WSD); nullopt: every step after the warmup decays.
  TORCH_ARG(std::optional<double>, decay_ratio) = std::nullopt;
  /// "linear", "sqrt" (1 - sqrt(progress)) or "cosine" (half a cosine).
  TORCH_ARG(std::string, decay_type) = "linear";
  /// The factor the decay ends at, in [0, 1].
  TORCH_ARG(double, lr_min) = 0.0;
};

class LrSchedule {
 public:
  /// te::Error naming the option for steps < 1, a negative warmup, a decay_ratio outside [0, 1],
  /// an unknown decay_type, an lr_min outside [0, 1], or warmup + decay longer than the run.
  explicit LrSchedule(LrScheduleOptions options);

  /// The factor of optimizer step `step` (from 0; past the run: the last step's).
  double factor(int64_t step) const;
  /// Sets every parameter group's lr to base_lr x factor(step) (AdamW, Adam, SGD, ...).
  void apply(torch::optim::Optimizer& optimizer, double base_lr, int64_t step) const;

  int64_t warmup_steps() const { return options_.warmup_steps(); }
  int64_t stable_steps() const { return stable_; }
  int64_t decay_steps() const { return decay_; }

 private:
  LrScheduleOptions options_;
  int64_t stable_ = 0, decay_ = 0;
};

}  // namespace te::optim
