// te::optim::LrSchedule: each step's factor as torchtitan's linear_warmup_stable_decay gives it
// (torchtitan/components/lr_scheduler.py at 0e13811), written out by hand for small runs.

#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <cmath>

#include "../expect_error.h"
#include "te/optim/lr_schedule.h"

namespace te::optim {
namespace {

const double kPi = std::acos(-1.0);

TEST(LrSchedule, WarmupStableDecayToAFloor) {
  // 10 steps: warmup 2, decay round(10 x 0.5) = 5, stable the 3 between; linear to 0.1.
  const LrSchedule s(LrScheduleOptions(10).warmup_steps(2).decay_ratio(0.5).lr_min(0.1));
  EXPECT_EQ(s.stable_steps(), 3);
  EXPECT_EQ(s.decay_steps(), 5);
  const double want[] = {1.0 / 3,
                         2.0 / 3,
                         1,
                         1,
                         1,
                         0.1 + 0.9 * (1 - 1.0 / 6),
                         0.1 + 0.9 * (1 - 2.0 / 6),
                         0.1 + 0.9 * (1 - 3.0 / 6),
                         0.1 + 0.9 * (1 - 4.0 / 6),
                         0.1 + 0.9 * (1 - 5.0 / 6),
                         0.1};
  for (int64_t k = 0; k <= 10; ++k) EXPECT_NEAR(s.factor(k), want[k], 1e-15) << "step " << k;
  EXPECT_EQ(s.factor(25), s.factor(10));  // past the run: its last step's
}

TEST(LrSchedule, CosineAndSqrtDecays) {
  // No warmup, no decay_ratio: all 4 steps decay, progress (k + 1) / 5.
  const LrSchedule cosine(LrScheduleOptions(4).decay_type("cosine"));
  for (int64_t k = 0; k < 4; ++k) {
    EXPECT_NEAR(cosine.factor(k), 0.5 * (1 + std::cos(kPi * (k + 1) / 5.0)), 1e-15) << k;
  }
  // Warmup 1, then 2 decaying steps, progress (k + 1 - 1) / 3.
  const LrSchedule sqrt_decay(LrScheduleOptions(3).warmup_steps(1).decay_type("sqrt"));
  EXPECT_NEAR(sqrt_decay.factor(0), 0.5, 1e-15);
  EXPECT_NEAR(sqrt_decay.factor(1), 1 - std::sqrt(1.0 / 3), 1e-15);
  EXPECT_NEAR(sqrt_decay.factor(2), 1 - std::sqrt(2.0 / 3), 1e-15);
  // A decay_ratio of 0: warmup, then the base rate to the end.
  const LrSchedule constant(LrScheduleOptions(5).warmup_steps(1).decay_ratio(0.0));
  EXPECT_EQ(constant.factor(4), 1.0);
}

TEST(LrSchedule, AppliesToEveryParameterGroup) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{at::zeros({2}, at::requires_grad())},
                      std::make_unique<torch::optim::AdamWOptions>(1.0));
  groups.emplace_back(std::vector<at::Tensor>{at::zeros({3}, at::requires_grad())},
                      std::make_unique<torch::optim::AdamWOptions>(1.0));
  torch::optim::AdamW optimizer(groups);
  const LrSchedule s(LrScheduleOptions(10).warmup_steps(3));
  s.apply(optimizer, 0.02, 1);
  for (auto& group : optimizer.param_groups()) EXPECT_DOUBLE_EQ(group.options().get_lr(), 0.01);
}

TEST(LrSchedule, BadOptionsAreNamed) {
  EXPECT_ERROR(LrSchedule(LrScheduleOptions(0)), "LrSchedule: steps 0 is not positive");
  EXPECT_ERROR(LrSchedule(LrScheduleOptions(10).warmup_steps(-1)), "warmup_steps -1 is negative");
  EXPECT_ERROR(LrSchedule(LrScheduleOptions(10).decay_type("step")),
               "decay_type 'step' is not linear, sqrt or cosine");
  EXPECT_ERROR(LrSchedule(LrScheduleOptions(10).lr_min(1.5)), "lr_min 1.5 is not in [0, 1]");
  EXPECT_ERROR(LrSchedule(LrScheduleOptions(10).decay_ratio(2.0)), "decay_ratio 2 is not in");
  EXPECT_ERROR(LrSchedule(LrScheduleOptions(10).warmup_steps(8).decay_ratio(0.5)),
               "warmup_steps 8 and the decay's 5 steps are more than the run's 10");
  EXPECT_ERROR(LrSchedule(LrScheduleOptions(10)).factor(-1), "step -1 is negative");
}

}  // namespace
}  // namespace te::optim
