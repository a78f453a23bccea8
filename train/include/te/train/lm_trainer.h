#pragma once

// The training step of a causal language model on whatever mesh is in scope: the next-token
// loss of a global batch of micro-batches (the mean over every label token of the step, as if it
// were one batch), one data-parallel reduction after the last micro-batch (te::GradientBuckets),
// the whole gradient's norm and clipping (te::optim::clip_grad_norm), the learning rate of the
// step's schedule (te::optim::LrSchedule), and te::optim::AdamW (fp32 masters for bf16 and fp16
// weights; norms and biases out of weight decay; ZeRO-1 on request), with dynamic loss scaling
// for fp16 weights (te::optim::GradScaler). Every rank passes the same global micro-batches: each
// takes its share by the rules' batch and seqlen axes, and the logits stay sharded over the
// vocabulary (te::nn::functional::parallel_cross_entropy). tests/interop/check_train_steps.py
// holds the step to transformers + torch.optim.AdamW; te-train (examples/train/) runs it.
//
// Example:
//   te::train::LmTrainer trainer(model, te::train::TrainerOptions{
//       te::optim::AdamWOptions(3e-4).weight_decay(0.1),
//       te::optim::LrScheduleOptions(1000).warmup_steps(100).decay_type("cosine")});
//   for (int64_t step = 0; step < 1000; ++step) {
//     const te::train::StepStats s = trainer.step({data.train.next()}, step);
//   }

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "te/fp8/recipe.h"
#include "te/hf/causal_lm.h"
#include "te/nn/plan.h"
#include "te/optim/adamw.h"
#include "te/optim/grad_scaler.h"
#include "te/optim/lr_schedule.h"
#include "te/train/loader.h"

namespace te::train {

struct TrainerOptions {
  /// The optimizer; its lr is the schedule's base learning rate.
  te::optim::AdamWOptions adamw;
  /// The run's schedule (its steps are the run's): required.
  std::optional<te::optim::LrScheduleOptions> schedule;
  /// The largest gradient norm (clipped to it above); 0: not clipped (the norm is still
  /// measured).
  double clip = 1.0;
  /// Which parameters stay out of weight decay.
  te::optim::NoDecayRule no_decay = te::optim::default_no_decay;
  /// ZeRO-1: AdamW's state of the parameters replicated over this axis of the mesh in scope
  /// (the data axis) split over its ranks (te::optim::ZeroSharding); empty: laid out as each
  /// parameter.
  std::string zero_axis;
  /// Dynamic loss scaling (te::optim::GradScaler), used when the model's weights are float16:
  /// a step whose gradient holds an inf or nan is skipped and counted, the scale backed off.
  te::optim::GradScalerOptions loss_scaling;
  /// FP8 GEMMs: each step's forward and backward passes (all its micro-batches) run in one
  /// te::Fp8Autocast of this recipe with the MeshResource in scope, as TE's fp8_autocast around a
  /// training step; unset: the model's dtype. Evaluation stays in the model's dtype.
  std::optional<te::fp8::Recipe> fp8;
};

/// What one step did, the same on every rank.
struct StepStats {
  /// The mean next-token cross-entropy over the step's label tokens, plus router_loss.
  double loss = 0;
  /// A mixture of experts whose config counts the router's load-balancing loss
  /// (CausalLMConfig::output_router_logits, as transformers' loss does): router_aux_loss_coef
  /// times each micro-batch's load-balancing loss over every sparse layer
  /// (te::hf::router_aux_loss), weighted by its share of the step's label tokens (the
  /// micro-batches' mean when they are equal, as Megatron averages them); else 0.
  double router_loss = 0;
  double grad_norm = 0;  ///< the whole gradient's 2-norm, before clipping
  double lr = 0;         ///< the learning rate the step ran at
  int64_t tokens = 0;    ///< input tokens of the global batch
  int64_t label_tokens = 0;
  /// float16: the loss scale the step ran at, and whether it was skipped (a non-finite
  /// gradient: the weights and optimizer state unchanged, the scale backed off).
  double loss_scale = 0;
  bool skipped = false;
};

class LmTrainer {
 public:
  /// Builds the optimizer over `model`'s parameters (the model trains in its own dtype: bf16
  /// weights get fp32 masters). te::Error naming the option for a bad or missing schedule or a
  /// bad optimizer option.
  LmTrainer(te::hf::CausalLM model, TrainerOptions options);

  /// Optimizer step `step` (from 0) over the global micro-batches `micro` (gradient
  /// accumulation: one reduction, one update). te::Error for no micro-batch, a step past the
  /// schedule's, a micro-batch whose label_tokens is not the count of its labels other than
  /// -100, a step without a label token, or packed rows (cu_seqlens) for a model not built
  /// for them. Packed rows (a model built with CausalLMConfig::packed_sequences) run as rows of
  /// THD batches (CausalLM::forward_packed), each document attending within itself with its own
  /// positions; on a mesh the rows split as whole rows do (data parallel, FSDP) and the heads
  /// under tensor parallelism; rules that split a row's tokens (seqlen) are a te::Error.
  StepStats step(const std::vector<Batch>& micro, int64_t step);

  /// The mean next-token cross-entropy over the label tokens of `batches` (no gradient, in eval
  /// mode; the model's mode is restored after; without the router's loss, so exp of it is the
  /// perplexity).
  double evaluate(const std::vector<Batch>& batches);

  te::hf::CausalLM& model() { return model_; }
  te::optim::AdamW& optimizer() { return optimizer_; }
  /// The loss scaler of a float16 model, else nullptr.
  te::optim::GradScaler* loss_scaler() { return scaler_ ? &*scaler_ : nullptr; }
  const te::optim::LrSchedule& schedule() const { return schedule_; }

 private:
  te::hf::CausalLM model_;
  TrainerOptions options_;
  te::optim::AdamW optimizer_;
  te::optim::LrSchedule schedule_;
  std::optional<te::optim::GradScaler> scaler_;
};

/// The shape of one LmTrainer step, for plan_lm_step.
struct LmStepShape {
  int64_t micro_batch = 1;    ///< rows of a micro-batch
  int64_t seq_len = 1;        ///< tokens of a row
  int64_t micro_batches = 1;  ///< micro-batches of the step (all held at once)
  bool packed = false;        ///< packed rows (each one document in the plan)
};

/// What one LmTrainer step over a CausalLM of `config` (weights in `dtype`) with `options` needs
/// on rank `where.rank` of `where`'s mesh, under the rules and MeshResource in scope: the model,
/// a micro-batch's loss, backward with the data-parallel reduction and te::optim::AdamW's step
/// (fp32 masters, moments, ZeRO's split) run on meta tensors by te::nn::plan_step, so the bytes
/// are the allocations of the real step (te-train reports both). Counted beside them: the
/// clip's widened copy of the largest gradient; not counted: the fp16 loss scaler's checks.
te::nn::Plan plan_lm_step(const te::hf::CausalLMConfig& config, at::ScalarType dtype,
                          const TrainerOptions& options, const LmStepShape& shape,
                          const te::nn::PlanStepOptions& where);

}  // namespace te::train
