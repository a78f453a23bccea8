// te-train's run on one rank: the model (fine-tuned, or from a config at random), the data, the
// training loop of te::train::LmTrainer with its reports, checkpoints and resume, evaluation and
// the export as Hugging Face files.

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>
#include <future>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "args.h"
#include "mfu.h"
#include "model.h"
#include "te/distributed.h"
#include "te/error.h"
#include "te/hf/save.h"
#include "te/input_error.h"
#include "te/nn/checkpoint.h"
#include "te/nn/context_parallel.h"
#include "te/program/layout.h"
#include "te/program/precision.h"
#include "te/program/report.h"
#include "te/runtime/meta.h"
#include "te/train/data.h"
#include "te/train/lm_trainer.h"

namespace train {

namespace {

namespace fs = std::filesystem;
using te::program::fmt;

at::ScalarType dtype_of(const Args& a) {
  return a.dtype == "bf16" ? at::kBFloat16 : a.dtype == "fp16" ? at::kHalf : at::kFloat;
}

int64_t micro_batches_of(const Args& a) {
  const int64_t tokens = a.micro_batch * a.seq_len;
  return a.global_batch_tokens == 0 ? 1 : a.global_batch_tokens / tokens;
}

te::train::TrainerOptions trainer_options(const Args& a) {
  te::train::TrainerOptions o;
  o.adamw = te::optim::AdamWOptions(a.lr).betas({a.beta1, a.beta2}).weight_decay(a.weight_decay);
  o.schedule = te::optim::LrScheduleOptions(a.steps)
                   .warmup_steps(a.warmup)
                   .decay_type(a.schedule == "wsd" ? "linear" : a.schedule)
                   .decay_ratio(a.decay_ratio)
                   .lr_min(a.lr_min);
  o.clip = a.clip;
  o.zero_axis = a.zero_axis;
  o.loss_scaling.init_scale(a.loss_scale);
  o.fp8 = te::program::recipe_of(a.fp8);
  return o;
}

// Waits for rank 0's `built` (run on a thread of its own) with every rank checking in once a
// second (one small all-reduce of rank 0's state: running, done or failed), so that tokenizing a
// large file outlasts no collective timeout, and a failure there stops every rank at once.
void wait_for_rank0(const te::DeviceMesh& mesh, int rank, std::future<void>* built) {
  std::exception_ptr failed;
  for (;;) {
    double state = 0;  // 0 running, 1 done, 2 failed
    if (rank == 0 && built->wait_for(std::chrono::seconds(1)) == std::future_status::ready) {
      try {
        built->get();
        state = 1;
      } catch (...) {
        failed = std::current_exception();
        state = 2;
      }
    }
    const double all = te::program::reduce_over_ranks(mesh, state, te::ReduceOp::kMax);
    if (all == 1) return;
    if (all == 2) {
      if (failed) std::rethrow_exception(failed);
      throw te::InputError("rank 0 could not read the data (its error says why)");
    }
  }
}

// The data, tokenized by rank 0 first (one token file, written once) and then opened by every
// other rank.
te::train::Data open_data(const Args& a, const OpenedModel& m, int rank) {
  te::train::DataSpec spec;
  spec.train_path = a.data;
  spec.eval_path = a.eval_data;
  spec.eval_fraction = a.eval_fraction;
  spec.tokens.eos_id = m.eos_id;
  spec.tokens.chat_template = m.chat_template;
  spec.tokens.progress = rank == 0 && !a.quiet;
  spec.tokens.source.kind = te::train::parse_source_kind(a.data_format);
  spec.tokens.source.text_field = a.text_field;
  spec.batches.seq_len = a.seq_len;
  spec.batches.batch_size = a.micro_batch;
  spec.batches.seed = a.seed;
  spec.batches.packed = a.pack;
  spec.batches.pack_align =
      pack_align_of(a, a.cp_comm_type.empty() ? 1 : te::nn::functional::cp_size_in_scope());
  const te::DeviceMesh* mesh = te::current_mesh();
  if (mesh == nullptr || mesh->size() == 1) return te::train::open_data(spec, *m.tokenizer);
  std::optional<te::train::Data> data;
  std::future<void> built;
  if (rank == 0) {
    built = std::async(std::launch::async,
                       [&] { data.emplace(te::train::open_data(spec, *m.tokenizer)); });
  }
  wait_for_rank0(*mesh, rank, &built);
  if (rank == 0) return std::move(*data);
  return te::train::open_data(spec, *m.tokenizer);
}

// What a checkpoint must agree on with this run to be resumed by it.
nlohmann::json run_identity(const Args& a, const OpenedModel& m) {
  const te::hf::CausalLMConfig& c = m.model->config;
  const nlohmann::json sizes = {c.model_type,          c.vocab_size,          c.hidden_size,
                                c.intermediate_size,   c.num_hidden_layers,   c.num_attention_heads,
                                c.num_key_value_heads, c.tie_word_embeddings, c.rms_norm_eps};
  const nlohmann::json schedule = {a.steps, a.warmup, a.schedule, a.decay_ratio.value_or(-1.0),
                                   a.lr,    a.lr_min};
  return {{"model_config", m.config.empty() ? sizes.dump() : m.config},
          {"schedule", schedule},
          {"dtype", a.dtype},
          {"fp8", a.fp8},
          {"seq_len", a.seq_len},
          {"packed", a.pack},
          {"micro_batch", a.micro_batch},
          {"micro_batches", micro_batches_of(a)}};
}

void save(const Args& a, te::train::LmTrainer& trainer, const te::train::Data& data,
          const nlohmann::json& identity, int64_t steps_done) {
  nlohmann::json extra = {{"te_train", identity},
                          {"step", steps_done},
                          {"data", nlohmann::json::parse(data.train.state_json())}};
  if (const te::optim::GradScaler* scaler = trainer.loss_scaler()) {
    extra["loss_scaler"] = {{"scale", scaler->get_scale()},
                            {"growth_tracker", scaler->growth_tracker()},
                            {"skipped_steps", scaler->skipped_steps()}};
  }
  te::nn::save_checkpoint(*trainer.model(), a.save_dir, extra.dump(), &trainer.optimizer());
}

// --resume: the model, optimizer and data position of the checkpoint in --save; returns the
// steps it had done.
int64_t resume(const Args& a, te::train::LmTrainer& trainer, te::train::Data& data,
               const nlohmann::json& identity) {
  const te::nn::CheckpointInfo info = te::nn::read_checkpoint_info(a.save_dir);
  const nlohmann::json extra = nlohmann::json::parse(info.extra_json);
  if (!extra.contains("te_train")) {
    throw te::InputError("--resume: the checkpoint at '" + a.save_dir +
                         "' was not saved by te-train");
  }
  for (const auto& [key, value] : identity.items()) {
    // Checkpoints from before --fp8 trained without it.
    const nlohmann::json saved_default = key == "fp8"      ? nlohmann::json("none")
                                         : key == "packed" ? nlohmann::json(false)
                                                           : nlohmann::json();
    if (extra["te_train"].value(key, saved_default) != value) {
      throw te::InputError(
          "--resume: the checkpoint at '" + a.save_dir + "' was saved by a run with another " +
          key + " (" + extra["te_train"].value(key, saved_default).dump() +
          ", this run: " + value.dump() + "); resume with the same model, " +
          "--dtype, --fp8, --seq-len, --pack, --micro-batch, --global-batch-tokens and schedule "
          "(--steps, --warmup, --schedule, --decay-ratio, --lr, --lr-min)");
    }
  }
  te::nn::load_checkpoint(*trainer.model(), a.save_dir, {}, &trainer.optimizer());
  data.train.load_state_json(extra.at("data").dump());
  try {
    if (te::optim::GradScaler* scaler = trainer.loss_scaler();
        scaler && extra.contains("loss_scaler")) {
      const nlohmann::json& l = extra["loss_scaler"];
      scaler->restore(l.at("scale").get<double>(), l.at("growth_tracker").get<int64_t>(),
                      l.at("skipped_steps").get<int64_t>());
    }
    return extra.at("step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw te::InputError("--resume: the checkpoint at '" + a.save_dir +
                         "' has a malformed te-train record (" + e.what() + ")");
  }
}

// The first --eval-batches batches of the evaluation data, in order.
std::vector<te::train::Batch> eval_batches(const Args& a, te::train::Data& data) {
  std::vector<te::train::Batch> out;
  if (!data.eval) return out;
  const int64_t n = std::min(a.eval_batches, data.eval->steps_per_epoch());
  for (int64_t i = 0; i < n; ++i) out.push_back(data.eval->batch({0, i}));
  return out;
}

struct Totals {
  double seconds = 0, last_loss = 0, eval_loss = std::nan(""), first_eval_loss = std::nan("");
  // fp16 steps whose gradient overflowed: in this run, and since step 0 (the checkpoint's too).
  int64_t tokens = 0, steps = 0, skipped = 0, skipped_total = 0;
  // The most tensor bytes this rank held at once during a step (te::AllocationCounter).
  int64_t peak_bytes = 0;
};

void report_step(const Args& a, int64_t step, const te::train::StepStats& s, double seconds,
                 const Mfu& mfu, bool lead) {
  if (!lead || a.log_every <= 0) return;
  if ((step + 1) % a.log_every != 0 && step + 1 != a.steps && step != 0 && !s.skipped) return;
  const double tokens_per_second = static_cast<double>(s.tokens) / seconds;
  std::cout << "step " << step + 1 << "/" << a.steps << ": loss " << fmt("%.4f", s.loss)
            << (s.router_loss != 0 ? " (router " + fmt("%.4f", s.router_loss) + ")" : "")
            << " grad_norm " << fmt("%.3f", s.grad_norm) << " lr " << fmt("%.3e", s.lr) << " "
            << fmt("%.0f", tokens_per_second) << " tokens/s mfu "
            << fmt("%.2f%%", 100 * mfu.of(tokens_per_second))
            << (s.skipped ? " skipped: gradient overflow at loss scale " + fmt("%g", s.loss_scale)
                          : std::string())
            << std::endl;
}

double evaluate(te::train::LmTrainer& trainer, const std::vector<te::train::Batch>& batches,
                int64_t steps_done, bool lead) {
  const double loss = trainer.evaluate(batches);
  if (lead) {
    std::cout << "eval after " << steps_done << " steps: loss " << fmt("%.4f", loss)
              << " perplexity " << fmt("%.3f", std::exp(loss)) << std::endl;
  }
  return loss;
}

Totals loop(const Args& a, te::train::LmTrainer& trainer, te::train::Data& data, int64_t start,
            const nlohmann::json& identity, const Mfu& mfu, bool lead, int rank,
            te::AllocationCounter& memory) {
  Totals t;
  const std::vector<te::train::Batch> eval = eval_batches(a, data);
  if (!eval.empty()) t.first_eval_loss = t.eval_loss = evaluate(trainer, eval, start, lead);
  // A resumed run keeps the steps its file logged up to the checkpoint.
  te::program::StepLog log(
      rank == 0 ? a.log_steps : std::string(),
      {"step", "loss", "grad_norm", "lr", "tokens_per_second", "mfu", "peak_flops"}, "--log-steps",
      start);
  const int64_t micro = micro_batches_of(a);
  const int64_t stop = a.max_steps > 0 ? a.max_steps : a.steps;
  for (int64_t step = start; step < stop; ++step) {
    std::vector<te::train::Batch> batches;
    for (int64_t m = 0; m < micro; ++m) batches.push_back(data.train.next());
    memory.reset_peak();
    const auto begin = std::chrono::steady_clock::now();
    const te::train::StepStats s = trainer.step(batches, step);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    t.peak_bytes = std::max(t.peak_bytes, memory.peak_bytes());
    t.seconds += seconds;
    t.tokens += s.tokens;
    t.last_loss = s.loss;
    ++t.steps;
    t.skipped += s.skipped ? 1 : 0;
    if (const te::optim::GradScaler* scaler = trainer.loss_scaler()) {
      t.skipped_total = scaler->skipped_steps();
    }
    report_step(a, step, s, seconds, mfu, lead);
    const double tokens_per_second = static_cast<double>(s.tokens) / seconds;
    log.add({step + 1, s.loss, s.grad_norm, s.lr, tokens_per_second, mfu.of(tokens_per_second),
             mfu.peak_flops});
    const bool last = step + 1 == stop;
    if (!eval.empty() && (last || (a.eval_every > 0 && (step + 1) % a.eval_every == 0))) {
      t.eval_loss = evaluate(trainer, eval, step + 1, lead);
    }
    // The last step's checkpoint is the run's final save.
    if (!a.save_dir.empty() && a.save_every > 0 && (step + 1) % a.save_every == 0 && !last) {
      save(a, trainer, data, identity, step + 1);
    }
  }
  log.finish();
  return t;
}

// What one step of this run needs on this rank, planned on meta tensors for its model, layout
// and options (te::train::plan_lm_step): te-train --plan prints it, a run reports it beside
// what it measured.
te::nn::Plan plan_run(const Args& a, const te::program::Layout& layout,
                      const te::hf::CausalLMConfig& config, int rank) {
  te::nn::PlanStepOptions where;
  if (layout.mesh) {
    where.mesh_shape = layout.mesh->sizes;
    where.mesh_axes = layout.mesh->names;
  }
  where.rank = rank;
  te::train::LmStepShape shape;
  shape.micro_batch = a.micro_batch;
  shape.seq_len = a.seq_len;
  shape.micro_batches = micro_batches_of(a);
  shape.packed = a.pack;
  return te::train::plan_lm_step(config, dtype_of(a), trainer_options(a), shape, where);
}

// The largest of each rank's `v`.
int64_t max_over_ranks(int64_t v) {
  const te::DeviceMesh* mesh = te::current_mesh();
  if (mesh == nullptr || mesh->size() == 1) return v;
  return static_cast<int64_t>(
      te::program::reduce_over_ranks(*mesh, static_cast<double>(v), te::ReduceOp::kMax));
}

// A step's tensor bytes on the fullest rank: measured, and planned (-1: no plan, and why).
struct Memory {
  int64_t peak_bytes = 0;
  int64_t planned_bytes = -1;
  std::string plan_error;
};

double tokens_per_second(const Totals& t) {
  return t.seconds > 0 ? static_cast<double>(t.tokens) / t.seconds : 0;
}

void report_run(const Totals& t, const Mfu& mfu, const Memory& memory, bool lead) {
  if (!lead) return;
  std::cout << "done: " << t.steps << " steps in " << fmt("%.1f", t.seconds) << "s, "
            << fmt("%.0f", tokens_per_second(t)) << " tokens/s, mfu "
            << fmt("%.2f%%", 100 * mfu.of(tokens_per_second(t))) << "\n  memory: a step's peak "
            << fmt("%.1f", static_cast<double>(memory.peak_bytes) / (1 << 20))
            << " MiB of tensors on the fullest rank, "
            << (memory.planned_bytes >= 0
                    ? "planned " +
                          fmt("%.1f", static_cast<double>(memory.planned_bytes) / (1 << 20)) +
                          " MiB (--plan shows the parts)"
                    : "no plan: " + memory.plan_error)
            << std::endl;
}

void write_metrics(const Args& a, const Totals& t, const Mfu& mfu, const Memory& memory,
                   int world_size) {
  nlohmann::json j = {{"steps", a.steps},
                      {"steps_run", t.steps},
                      {"final_loss", t.last_loss},
                      {"seconds", t.seconds},
                      {"tokens_per_second", tokens_per_second(t)},
                      {"mfu", mfu.of(tokens_per_second(t))},
                      {"peak_flops", mfu.peak_flops},
                      {"model_flops_per_token", mfu.flops_per_token},
                      {"world_size", world_size},
                      {"dtype", a.dtype},
                      {"fp8", a.fp8},
                      {"skipped_steps", t.skipped_total},
                      {"peak_bytes", memory.peak_bytes},
                      {"planned_peak_bytes", memory.planned_bytes}};
  if (!std::isnan(t.eval_loss)) {
    j["eval"] = {{"loss_before", t.first_eval_loss},
                 {"loss", t.eval_loss},
                 {"perplexity_before", std::exp(t.first_eval_loss)},
                 {"perplexity", std::exp(t.eval_loss)}};
  }
  te::program::write_json_atomically(j, a.metrics_json, "--metrics-json");
}

}  // namespace

// Runs `f`, a step that reads the user's files: a te::Error there is bad input (exit 2).
template <typename F>
auto reading_input(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const te::InputError&) {
    throw;
  } catch (const te::Error& e) {
    throw te::InputError(te::program::one_line(e.what()));
  }
}

int run(const Args& a, const te::program::Layout& layout, int rank, int world_size) {
  const bool lead = rank == 0 && !a.quiet;
  const te::program::LayoutScope scope(layout);
  te::AllocationCounter memory;  // this rank's tensors, from the model on
  OpenedModel m = reading_input([&] { return open_model(a); });
  if (a.plan) {
    const te::nn::Plan plan = plan_run(a, layout, m.model->config, rank);
    if (rank == 0) {
      std::cout << "te-train --plan: one step of " << micro_batches_of(a) << " micro-batch(es) of "
                << a.micro_batch << " x " << a.seq_len << " tokens, " << a.dtype
                << (a.fp8 == "none" ? "" : ", fp8 " + a.fp8) << ", " << layout.description << "\n"
                << plan.table();
    }
    return 0;
  }
  Memory step_memory;
  try {
    step_memory.planned_bytes = plan_run(a, layout, m.model->config, rank).peak_bytes;
  } catch (const std::exception& e) {  // a report, not the run: the reason is printed at the end
    step_memory.plan_error = te::program::one_line(e.what());
  }
  te::train::Data data = reading_input([&] { return open_data(a, m, rank); });
  if (a.dtype != "fp32") m.model->to(a.dtype == "bf16" ? at::kBFloat16 : at::kHalf);
  te::train::LmTrainer trainer(m.model, trainer_options(a));
  const nlohmann::json identity = run_identity(a, m);
  int64_t start = 0;
  if (a.resume) {
    start = reading_input([&] { return resume(a, trainer, data, identity); });
    const int64_t stop = a.max_steps > 0 ? a.max_steps : a.steps;
    if (start >= stop) {
      throw te::InputError("--resume: the checkpoint at '" + a.save_dir + "' has done " +
                           std::to_string(start) + " steps, and this run stops at " +
                           std::to_string(stop) + "; give a larger --max-steps (or none)");
    }
    if (lead) std::cout << "resumed " << a.save_dir << " after step " << start << std::endl;
  }
  const Mfu mfu = make_mfu(a, *trainer.model());
  if (lead) {
    print_banner(a, m, data, world_size, micro_batches_of(a));
    const te::hf::CausalLMConfig& c = trainer.model()->config;
    std::cout << "  layout: " << layout.description
              << (!c.cp_comm_type ? ""
                  : a.pack ? " (context parallel, each row's documents in TE's thd layout, slots "
                             "of " +
                                 std::to_string(
                                     pack_align_of(a, te::nn::functional::cp_size_in_scope())) +
                                 " tokens)"
                  : c.cp_load_balanced
                      ? " (context parallel, load-balanced order)"
                      : " (context parallel, contiguous chunks: the model has dropout outside "
                        "attention, which the load-balanced order would draw elsewhere)")
              << "\n  mfu against a peak of " << fmt("%.3f", mfu.peak_flops / 1e12) << " TFLOP/s ("
              << mfu.peak_source << "), " << fmt("%.4g", mfu.flops_per_token / 1e6)
              << " MFLOP a token (6 x " << mfu.gemm_params << " GEMM parameters + 12 L H T)"
              << std::endl;
  }
  const Totals t = loop(a, trainer, data, start, identity, mfu, lead, rank, memory);
  step_memory.peak_bytes = max_over_ranks(t.peak_bytes);
  step_memory.planned_bytes = max_over_ranks(step_memory.planned_bytes);
  if (!a.save_dir.empty() && t.steps > 0) {
    save(a, trainer, data, identity, start + t.steps);
    if (lead) std::cout << "saved " << a.save_dir << std::endl;
  }
  if (!a.export_hf.empty()) {
    export_hf(a, m, *trainer.model());
    if (lead) std::cout << "exported " << a.export_hf << std::endl;
  }
  if (!a.export_gguf.empty()) {
    export_gguf(a, *trainer.model());
    if (lead) std::cout << "exported " << a.export_gguf << std::endl;
  }
  report_run(t, mfu, step_memory, lead);
  if (rank == 0 && !a.metrics_json.empty()) write_metrics(a, t, mfu, step_memory, world_size);
  return 0;
}

}  // namespace train
