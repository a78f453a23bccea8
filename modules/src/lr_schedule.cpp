// te::optim::LrSchedule (see lr_schedule.h).

#include "te/optim/lr_schedule.h"

#include <cmath>

#include "te/error.h"

namespace te::optim {

LrSchedule::LrSchedule(LrScheduleOptions options) : options_(std::move(options)) {
  const LrScheduleOptions& o = options_;
  TE_CHECK(o.steps() >= 1, "LrSchedule: steps ", o.steps(), " is not positive");
  TE_CHECK(o.warmup_steps() >= 0, "LrSchedule: warmup_steps ", o.warmup_steps(), " is negative");
  TE_CHECK(o.decay_type() == "linear" || o.decay_type() == "sqrt" || o.decay_type() == "cosine",
           "LrSchedule: decay_type '", o.decay_type(), "' is not linear, sqrt or cosine");
  TE_CHECK(o.lr_min() >= 0 && o.lr_min() <= 1, "LrSchedule: lr_min ", o.lr_min(),
           " is not in [0, 1] (a fraction of the base learning rate)");
  if (o.decay_ratio()) {
    const double r = *o.decay_ratio();
    TE_CHECK(r >= 0 && r <= 1, "LrSchedule: decay_ratio ", r, " is not in [0, 1]");
    decay_ = std::llround(static_cast<double>(o.steps()) * r);
  } else {
    decay_ = o.steps() - o.warmup_steps();
  }
  stable_ = o.steps() - o.warmup_steps() - decay_;
  TE_CHECK(decay_ >= 0 && stable_ >= 0, "LrSchedule: warmup_steps ", o.warmup_steps(),
           " and the decay's ", decay_, " steps are more than the run's ", o.steps(),
           "; shorten the warmup or the decay_ratio");
}

double LrSchedule::factor(int64_t step) const {
  TE_CHECK(step >= 0, "LrSchedule: step ", step, " is negative");
  const int64_t warmup = options_.warmup_steps(), warmup_stable = warmup + stable_;
  if (step >= warmup_stable + decay_) step = warmup_stable + decay_;  // past the run: its last
  if (step < warmup) return static_cast<double>(step + 1) / static_cast<double>(warmup + 1);
  if (step < warmup_stable || decay_ == 0) return 1.0;
  const double progress =
      static_cast<double>(step + 1 - warmup_stable) / static_cast<double>(decay_ + 1);
  double f = 1 - progress;
  if (options_.decay_type() == "sqrt") {
    f = 1 - std::sqrt(progress);
  } else if (options_.decay_type() == "cosine") {
    f = 0.5 * (1.0 + std::cos(std::acos(-1.0) * progress));
  }
  return options_.lr_min() + (1 - options_.lr_min()) * f;
}

void LrSchedule::apply(torch::optim::Optimizer& optimizer, double base_lr, int64_t step) const {
  const double lr = base_lr * factor(step);
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace te::optim
