// te::train::LmTrainer: a causal LM's training step on the mesh in scope (see lm_trainer.h).

#include "te/train/lm_trainer.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "te/distributed.h"
#include "te/error.h"
#include "te/fp8.h"
#include "te/nn/context_parallel.h"
#include "te/nn/functional.h"
#include "te/optim/clip_grad.h"
#include "te/sharding.h"

namespace te::train {

namespace {

namespace F = te::nn::functional;

// Packed rows' cu_seqlens (or cu_seqlens_padded, `name`) as one [rows, sequences + 1] tensor
// (a row with fewer sequences repeats its last entry: empty sequences).
at::Tensor rows_cu_seqlens(te::hf::CausalLM& model, const Batch& b,
                           const std::vector<at::Tensor>& per_row, const std::string& name) {
  TE_CHECK(model->config.packed_sequences,
           "LmTrainer: the batch holds packed rows (cu_seqlens) and the model was built for "
           "whole rows; build it with CausalLMConfig::packed_sequences "
           "(te::hf::LoadOptions::packed_sequences)");
  TE_CHECK(static_cast<int64_t>(per_row.size()) == b.ids.size(0), "LmTrainer: ", per_row.size(),
           " ", name, " for ", b.ids.size(0), " packed rows");
  const int64_t seq = b.ids.size(1);
  // cu_seqlens sum the valid lengths (a row's may end before its tokens do, when slots pad
  // them); cu_seqlens_padded, the slots, reach the row's end.
  const bool slots = &per_row == &b.cu_seqlens_padded;
  std::vector<at::Tensor> rows;
  int64_t entries = 0;
  for (std::size_t r = 0; r < per_row.size(); ++r) {
    rows.push_back(F::checked_cu_seqlens(per_row[r], "LmTrainer",
                                         "packed row " + std::to_string(r) + "'s " + name, seq,
                                         /*tail_padding=*/!slots));
    entries = std::max(entries, rows.back().size(0));
  }
  for (at::Tensor& cu : rows) {
    cu = at::cat({cu, cu.slice(0, -1).expand({entries - cu.size(0)})});
  }
  return at::stack(rows).to(at::kInt);
}

// The sum of the next-token cross-entropies of `b`'s label tokens, as a float32 scalar (every
// rank the same on a mesh). Packed rows attend each sequence alone, a row's tokens whole on one
// rank.
at::Tensor cross_entropy_sum(te::hf::CausalLM& model, const Batch& b) {
  F::CrossEntropyOptions ce;
  ce.reduce_loss = true;
  const double count = static_cast<double>(b.label_tokens);
  TE_CHECK(b.cu_seqlens_padded.empty() || b.cu_seqlens_padded.size() == b.cu_seqlens.size(),
           "LmTrainer: the batch has cu_seqlens_padded for ", b.cu_seqlens_padded.size(),
           " packed rows and cu_seqlens for ", b.cu_seqlens.size(),
           "; give the slots of every packed row, or none");
  for (std::size_t r = 0; r < b.cu_seqlens_padded.size(); ++r) {
    TE_CHECK(b.cu_seqlens_padded[r].numel() == b.cu_seqlens[r].numel(), "LmTrainer: packed row ", r,
             "'s cu_seqlens_padded has ", b.cu_seqlens_padded[r].numel(),
             " entries but its cu_seqlens ", b.cu_seqlens[r].numel(), "; one slot per sequence");
  }
  const at::Tensor cu =
      b.cu_seqlens.empty() ? at::Tensor() : rows_cu_seqlens(model, b, b.cu_seqlens, "cu_seqlens");
  const at::Tensor slots =
      b.cu_seqlens_padded.empty()
          ? at::Tensor()
          : rows_cu_seqlens(model, b, b.cu_seqlens_padded, "cu_seqlens_padded");
  auto forward = [&](const auto& ids) {
    return cu.defined() ? model->forward_packed(ids, cu, slots) : model->forward(ids);
  };
  const DeviceMesh* mesh = current_mesh();
  if (mesh == nullptr) {
    return F::parallel_cross_entropy(forward(b.ids), b.labels, ce) * count;
  }
  const std::vector<Placement> whole(static_cast<std::size_t>(mesh->ndim()), Replicate{});
  // Context parallelism's order of the tokens, ids and labels alike (the loss, a sum over
  // tokens, is the same): packed rows in TE's thd layout by their slots, whole rows in the
  // load-balanced order (CausalLMConfig::cp_load_balanced) or contiguous chunks.
  auto laid_out = [&](const at::Tensor& t) {
    return with_sharding_constraint(
        DTensor::distribute(te::hf::cp_token_order(model->config, t, slots.defined() ? slots : cu),
                            *mesh, whole),
        {axis::kBatch, axis::kSeqlen});
  };
  const DTensor ids = laid_out(b.ids);
  for (std::size_t m = 0;
       cu.defined() && !model->config.cp_comm_type && m < ids.placements().size(); ++m) {
    TE_CHECK(!is_shard(ids.placements()[m], 1),
             "LmTrainer: packed rows on a layout that splits the sequence over mesh axis '",
             mesh->axis_names()[m],
             "' (sequence parallel): each packed sequence needs its tokens on one rank; split "
             "the rows (data parallel, FSDP), the heads (tensor parallel) or the tokens by "
             "context parallelism (CausalLMConfig::cp_comm_type), or build the data without "
             "packing for this layout");
  }
  return F::parallel_cross_entropy(forward(ids), laid_out(b.labels), ce).to_local() * count;
}

// The sum of the training losses of `b`'s label tokens: cross_entropy_sum, plus, for a mixture
// of experts whose config counts the router's load-balancing loss (output_router_logits), that
// term (te::hf::router_aux_loss) per label token, whose sum `router` gets (else undefined).
at::Tensor loss_sum(te::hf::CausalLM& model, const Batch& b, at::Tensor& router) {
  if (!model->config.output_router_logits) return cross_entropy_sum(model, b);
  te::nn::RouterLoadScope loads;
  const at::Tensor ce = cross_entropy_sum(model, b);
  router =
      te::hf::router_aux_loss(model->config, loads.loads()) * static_cast<double>(b.label_tokens);
  return ce + router;
}

const te::optim::LrScheduleOptions& schedule_options(const TrainerOptions& o) {
  TE_CHECK(o.schedule.has_value(),
           "LmTrainer: TrainerOptions::schedule is not set; give te::optim::LrScheduleOptions("
           "steps) with the run's steps");
  return *o.schedule;
}

// `b`'s labels that are not -100, checked against its label_tokens.
void check_label_tokens(const Batch& b, std::size_t index) {
  const int64_t counted = b.labels.ne(-100).sum().item<int64_t>();
  TE_CHECK(counted == b.label_tokens, "LmTrainer: micro-batch ", index, " says label_tokens ",
           b.label_tokens, " but has ", counted,
           " labels other than -100; set label_tokens to "
           "their count");
}

std::optional<te::optim::ZeroSharding> zero_of(const TrainerOptions& o) {
  if (o.zero_axis.empty()) return std::nullopt;
  const DeviceMesh* mesh = current_mesh();
  TE_CHECK(mesh != nullptr, "LmTrainer: TrainerOptions::zero_axis '", o.zero_axis,
           "' without a mesh in scope; ZeRO splits the state over a mesh axis");
  return te::optim::ZeroSharding{*mesh, o.zero_axis};
}

}  // namespace

LmTrainer::LmTrainer(te::hf::CausalLM model, TrainerOptions options)
    : model_(std::move(model)),
      options_(std::move(options)),
      optimizer_(*model_, options_.adamw, options_.no_decay, zero_of(options_)),
      schedule_(schedule_options(options_)) {
  TE_CHECK(options_.clip >= 0, "LmTrainer: clip ", options_.clip,
           " is negative; give the largest gradient norm, or 0 for none");
  for (const auto& p : model_->parameters()) {
    if (p.scalar_type() == at::kHalf) {
      scaler_.emplace(options_.loss_scaling);
      break;
    }
  }
}

StepStats LmTrainer::step(const std::vector<Batch>& micro, int64_t step) {
  TE_CHECK(!micro.empty(), "LmTrainer::step: no micro-batch");
  TE_CHECK(step >= 0 && step < schedule_options(options_).steps(), "LmTrainer::step: step ", step,
           " is outside the schedule's ", schedule_options(options_).steps(), " steps");
  StepStats stats;
  for (std::size_t i = 0; i < micro.size(); ++i) {
    check_label_tokens(micro[i], i);
    stats.label_tokens += micro[i].label_tokens;
    stats.tokens += micro[i].ids.numel();
  }
  TE_CHECK(stats.label_tokens > 0, "LmTrainer::step: step ", step,
           " has no label token (every target is masked); the data holds no text to learn");
  model_->train();
  stats.lr = options_.adamw.lr() * schedule_.factor(step);
  schedule_.apply(optimizer_, options_.adamw.lr(), step);
  // No gradients rather than zero ones (torch's zero_grad(set_to_none=True)): backward writes
  // the first micro-batch's instead of adding it to zeros it had to fill.
  for (auto& p : model_->parameters()) p.mutable_grad().reset();
  double loss = 0;
  {
    std::optional<Fp8Autocast> fp8;  // its amax reductions after the buckets' (declared later)
    if (options_.fp8) fp8.emplace(true, *options_.fp8, current_mesh_resource());
    GradientBuckets buckets;  // the data-parallel reduction once, after the last micro-batch
    for (const Batch& b : micro) {
      at::Tensor router;
      const at::Tensor l = loss_sum(model_, b, router) / static_cast<double>(stats.label_tokens);
      (scaler_ ? scaler_->scale(l) : l).backward();
      loss += l.item<double>();
      if (router.defined()) {
        stats.router_loss += router.item<double>() / static_cast<double>(stats.label_tokens);
      }
    }
    buckets.finish();
  }
  stats.loss = loss;
  if (scaler_) {
    stats.loss_scale = scaler_->get_scale();
    stats.skipped = !scaler_->unscale(*model_);  // the same answer on every rank
  }
  if (stats.skipped) {
    stats.grad_norm = std::numeric_limits<double>::infinity();
  } else {
    stats.grad_norm = options_.clip > 0 ? te::optim::clip_grad_norm(*model_, options_.clip)
                                        : te::optim::grad_norm(*model_);
  }
  if (scaler_) {
    scaler_->step(optimizer_, *model_);  // skips when a gradient is not finite
    scaler_->update();
  } else {
    optimizer_.step();
  }
  return stats;
}

double LmTrainer::evaluate(const std::vector<Batch>& batches) {
  TE_CHECK(!batches.empty(), "LmTrainer::evaluate: no batch");
  torch::NoGradGuard no_grad;
  const bool was_training = model_->is_training();
  model_->eval();
  double sum = 0;
  int64_t count = 0;
  try {
    for (std::size_t i = 0; i < batches.size(); ++i) {
      check_label_tokens(batches[i], i);
      if (batches[i].label_tokens == 0) continue;
      sum += cross_entropy_sum(model_, batches[i]).item<double>();
      count += batches[i].label_tokens;
    }
  } catch (...) {
    model_->train(was_training);
    throw;
  }
  model_->train(was_training);
  TE_CHECK(count > 0, "LmTrainer::evaluate: the evaluation batches hold no label token");
  return sum / static_cast<double>(count);
}

te::nn::Plan plan_lm_step(const te::hf::CausalLMConfig& config, at::ScalarType dtype,
                          const TrainerOptions& options, const LmStepShape& shape,
                          const te::nn::PlanStepOptions& where) {
  TE_CHECK(shape.micro_batch >= 1 && shape.seq_len >= 1 && shape.micro_batches >= 1,
           "plan_lm_step: micro_batch ", shape.micro_batch, ", seq_len ", shape.seq_len,
           " and micro_batches ", shape.micro_batches, " must be positive");
  std::optional<te::hf::CausalLM> model;
  std::optional<te::optim::AdamW> optimizer;
  std::vector<Batch> micro;
  te::nn::PlannedStep step;
  step.build = [&] {
    te::hf::CausalLMConfig c = config;
    c.packed_sequences = shape.packed;
    model.emplace(c);
    if (dtype != at::kFloat) (*model)->to(dtype);
    return std::vector<std::shared_ptr<torch::nn::Module>>{model->ptr()};
  };
  step.micro_batches = shape.micro_batches;
  step.forward = [&](int64_t m) {
    if (micro.empty()) {  // the step's batches, all held while it runs
      const auto ids = at::TensorOptions().device(at::kMeta).dtype(at::kLong);
      for (int64_t i = 0; i < shape.micro_batches; ++i) {
        Batch b;
        b.ids = at::empty({shape.micro_batch, shape.seq_len}, ids);
        b.labels = at::empty({shape.micro_batch, shape.seq_len}, ids);
        b.position_ids = at::empty({shape.micro_batch, shape.seq_len}, ids);
        b.label_tokens = shape.micro_batch * shape.seq_len;
        for (int64_t r = 0; shape.packed && r < shape.micro_batch; ++r) {
          b.cu_seqlens.push_back(at::tensor({int64_t{0}, shape.seq_len}, at::kInt));
        }
        micro.push_back(std::move(b));
      }
    }
    std::optional<Fp8Autocast> fp8;
    if (options.fp8) fp8.emplace(true, *options.fp8, current_mesh_resource());
    const double tokens = static_cast<double>(micro[0].label_tokens * shape.micro_batches);
    return cross_entropy_sum(*model, micro[static_cast<std::size_t>(m)]) / tokens;
  };
  step.optimizer_step = [&] {
    optimizer.emplace(**model, options.adamw, options.no_decay, zero_of(options));
    // clip_grad_norm's norm of each gradient over a float64 copy, one at a time.
    int64_t largest = 0;
    for (const auto& p : (*model)->parameters()) {
      if (p.grad().defined()) largest = std::max(largest, p.grad().numel());
    }
    at::empty({largest}, at::TensorOptions().device(at::kMeta).dtype(at::kDouble));
    optimizer->step();
  };
  return te::nn::plan_step(where, step);
}

}  // namespace te::train
