// te-train's command line (CLI11) and the checks made before any rank starts.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <string>
#include <utility>

#include "args.h"
#include "te/input_error.h"
#include "te/nn/attention_types.h"
#include "te/optim/lr_schedule.h"
#include "te/program/precision.h"
#include "te/program/report.h"
#include "te/sharding.h"

namespace train {

namespace {

namespace fs = std::filesystem;

void add_model_and_data_options(CLI::App& app, Args& a) {
  auto* model = app.add_option("--model", a.model,
                               "A Hugging Face model directory (config.json, safetensors, "
                               "tokenizer) or a GGUF file to fine-tune");
  auto* config = app.add_option("--config", a.config,
                                "A config.json of any family te-cpp builds: train from random "
                                "weights (with --tokenizer)");
  model->excludes(config);
  app.add_option("--tokenizer", a.tokenizer,
                 "With --config: a tokenizer.json, a GGUF file or a model directory");
  app.add_option("--data", a.data,
                 "Training text: plain text (documents split by blank lines), JSON lines with a "
                 "text field, or chat JSON lines ({\"messages\": [...]}: the loss counts only "
                 "the assistant's tokens)")
      ->required();
  app.add_option("--data-format", a.data_format, "auto, text, jsonl or chat")
      ->check(CLI::IsMember({"auto", "text", "jsonl", "chat"}))
      ->capture_default_str();
  app.add_option("--text-field", a.text_field, "The text field of JSON lines")
      ->capture_default_str();
  app.add_option("--eval-data", a.eval_data, "Held-out text in the same format");
  app.add_option("--eval-fraction", a.eval_fraction,
                 "Without --eval-data: this share of the training documents held out");
}

void add_training_options(CLI::App& app, Args& a) {
  app.add_option("--steps", a.steps, "Optimizer steps of the run (the schedule spans them)")
      ->required();
  app.add_option("--max-steps", a.max_steps,
                 "Stop after this step, saving to --save (continue later with --resume)");
  app.add_option("--seq-len", a.seq_len, "Tokens per row")->capture_default_str();
  app.add_flag("--pack", a.pack,
               "Pack whole documents into the rows (TE's THD: each document attends within "
               "itself, its positions from 0; a document longer than a row is cut); on a mesh "
               "the rows split over data-parallel/FSDP ranks, the heads over tensor-parallel "
               "ones, a row's tokens over context-parallel ones. Without it a row is a block of "
               "the token stream");
  app.add_option("--pack-align", a.pack_align,
                 "--pack: each document's slot in a row is a multiple of N tokens, padded after "
                 "it (TE's pad_thd_sequences_for_cp); default 2*cp with --cp-comm-type (which "
                 "needs a multiple of 2*cp), else 1. Give a run's N to another layout to train "
                 "on the same rows (or resume its checkpoint)");
  app.add_option("--cp-comm-type", a.cp_comm_type,
                 "Context parallelism (TE's cp_comm_type: p2p, all_gather, a2a or a2a+p2p): each "
                 "layer's attention runs over rows whose tokens split over the mesh axis the rules "
                 "give seqlen_cp (--mesh-resource cp=AXIS, or --rules seqlen_cp=AXIS; a2a+p2p: "
                 "two axes, --rules seqlen_cp=(RING,A2A)), in TE's "
                 "load-balanced order (each rank chunks r and 2*cp-1-r of a row: --seq-len a "
                 "multiple of 2*cp) unless the model has dropout outside attention (then "
                 "contiguous chunks, which keep its masks one process's); with --pack each "
                 "row's documents in TE's thd layout (slots of --pack-align tokens)")
      ->check(CLI::IsMember(te::nn::te_names<te::nn::CpCommType>()));
  app.add_option("--micro-batch", a.micro_batch, "Rows per micro-batch (forward and backward)")
      ->capture_default_str();
  app.add_option("--global-batch-tokens", a.global_batch_tokens,
                 "Tokens per optimizer step: micro-batches accumulated with one reduction "
                 "(default: one micro-batch, --micro-batch x --seq-len)");
  app.add_option("--lr", a.lr, "Peak learning rate")->capture_default_str();
  app.add_option("--lr-min", a.lr_min, "Where the decay ends, a fraction of --lr")
      ->capture_default_str();
  app.add_option("--warmup", a.warmup, "Steps of linear warmup")->capture_default_str();
  app.add_option("--schedule", a.schedule,
                 "Decay after the warmup: cosine, linear, sqrt, or wsd (warmup-stable-decay: "
                 "linear over the last --decay-ratio of the steps)")
      ->check(CLI::IsMember({"cosine", "linear", "sqrt", "wsd"}))
      ->capture_default_str();
  app.add_option("--decay-ratio", a.decay_ratio,
                 "The decay's share of the steps (required by wsd, e.g. 0.2; without it the "
                 "decay takes every step after the warmup)");
  app.add_option("--weight-decay", a.weight_decay,
                 "AdamW's decoupled weight decay (norms and biases: none)")
      ->capture_default_str();
  app.add_option("--beta1", a.beta1, "AdamW's beta1")->capture_default_str();
  app.add_option("--beta2", a.beta2, "AdamW's beta2")->capture_default_str();
  app.add_option("--clip", a.clip, "Largest gradient norm (0: no clipping)")->capture_default_str();
  app.add_option("--router-aux-loss", a.router_aux_loss,
                 "A mixture of experts: add this weight times the routers' load-balancing loss "
                 "over every sparse layer to the loss, as transformers' does with "
                 "output_router_logits (0: the cross-entropy alone); default: the config's "
                 "(router_aux_loss_coef when output_router_logits is true)");
  app.add_option("--dtype", a.dtype,
                 "fp32, bf16 (bf16 weights and activations, fp32 master weights in AdamW), or "
                 "fp16 (the same in float16, with dynamic loss scaling: a step whose gradient "
                 "overflows is skipped, counted and the scale halved)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  app.add_option("--loss-scale", a.loss_scale,
                 "fp16: the initial loss scale (torch.amp.GradScaler's init_scale); halved at "
                 "each overflow, doubled after 2000 steps without one")
      ->capture_default_str();
  te::program::add_fp8_option(app, a.fp8);
  app.add_option("--seed", a.seed, "Seeds the data order and --config's random weights")
      ->capture_default_str();
}

void add_output_options(CLI::App& app, Args& a) {
  app.add_option("--save", a.save_dir,
                 "Checkpoint directory (sharded, reshards on load; written atomically)");
  app.add_option("--save-every", a.save_every, "Also save every N steps");
  app.add_flag("--resume", a.resume,
               "Continue the run saved in --save: the same losses, bit for bit, as without "
               "the interruption");
  app.add_option("--eval-every", a.eval_every, "Evaluate every N steps (and before and after)");
  app.add_option("--eval-batches", a.eval_batches, "Batches of the evaluation data to use")
      ->capture_default_str();
  app.add_option("--export-hf", a.export_hf,
                 "Write the trained model as config.json + model.safetensors (+ tokenizer) "
                 "that transformers, te-generate and te-serve load");
  app.add_option("--export-gguf", a.export_gguf,
                 "With a GGUF --model: write the trained model as a GGUF file like it (its "
                 "tokenizer and chat template kept) that llama.cpp, te-generate and te-serve load");
  app.add_option("--export-gguf-type", a.export_gguf_type, "The 2-D weights' type in --export-gguf")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "q8_0"}))
      ->capture_default_str();
  app.add_option("--log-steps", a.log_steps, "CSV of every step (te-plot-losses plots it)");
  app.add_option("--metrics-json", a.metrics_json, "The run's figures as JSON");
  app.add_option("--log-every", a.log_every, "Print every N steps")->capture_default_str();
  app.add_option("--peak-tflops", a.peak_tflops,
                 "The peak TFLOP/s of the hardware the run uses (all ranks) that MFU divides by; "
                 "without it, measured at the start: the best of a few dense 1024^3 and 2048^3 "
                 "at::matmul in bf16 (or fp32, where faster) for --dtype bf16, else fp32 (fp16 "
                 "GEMMs multiply in fp32 on the CPU), on each rank's threads, summed "
                 "over the ranks. MFU = tokens/s x (6 N + 12 L H T) / peak, N the parameters "
                 "that multiply in GEMMs (all but lookup-only embedding tables), L layers, H "
                 "heads x head dim, T --seq-len (PaLM's appendix B; with --pack the documents "
                 "are shorter, so this counts attention's FLOPs high)");
  app.add_flag("--quiet", a.quiet, "Print nothing but errors");
  app.add_flag("--plan", a.plan,
               "Print what one step of this run needs on each rank (parameters, gradients, "
               "optimizer state, activations, the step's peak; the collectives by phase and "
               "axis), planned on meta tensors as te-explain --plan does, and exit (--data is "
               "not read). A run reports its measured peak beside the plan's");
}

void check_model(const Args& a) {
  if (a.model.empty() && a.config.empty()) {
    throw te::InputError(
        "give --model DIR|FILE.gguf to fine-tune, or --config config.json "
        "with --tokenizer to train from random weights");
  }
  if (!a.config.empty() && a.tokenizer.empty()) {
    throw te::InputError(
        "--config needs --tokenizer (a tokenizer.json, GGUF file or model "
        "directory)");
  }
  if (!a.model.empty() && !fs::exists(a.model)) {
    throw te::InputError("--model: no such directory or file '" + a.model + "'");
  }
  if (!a.export_hf.empty() && !a.model.empty() && !fs::is_directory(a.model)) {
    throw te::InputError("--export-hf: the model '" + a.model +
                         "' is a GGUF file, which has no "
                         "config.json to export with; fine-tune a Hugging Face directory");
  }
  if (!a.export_gguf.empty() && (a.model.empty() || fs::is_directory(a.model))) {
    throw te::InputError(
        "--export-gguf needs a GGUF --model (its metadata and tokenizer are "
        "written with the weights); export a Hugging Face model with "
        "--export-hf");
  }
  if (!a.data.empty() && !fs::is_regular_file(a.data)) {
    throw te::InputError("--data: no such file '" + a.data + "'");
  }
  if (!a.eval_data.empty() && !fs::is_regular_file(a.eval_data)) {
    throw te::InputError("--eval-data: no such file '" + a.eval_data + "'");
  }
}

void check_numbers(const Args& a) {
  auto positive = [](int64_t v, const char* option) {
    if (v < 1)
      throw te::InputError(std::string(option) + " " + std::to_string(v) + " is not positive");
  };
  positive(a.steps, "--steps");
  positive(a.seq_len, "--seq-len");
  positive(a.micro_batch, "--micro-batch");
  const int64_t micro_tokens = a.micro_batch * a.seq_len;
  if (a.global_batch_tokens < 0 || a.global_batch_tokens % micro_tokens != 0) {
    throw te::InputError("--global-batch-tokens " + std::to_string(a.global_batch_tokens) +
                         " is not a multiple of a micro-batch's " + std::to_string(micro_tokens) +
                         " tokens (--micro-batch x --seq-len)");
  }
  if (a.warmup < 0 || a.warmup >= a.steps) {
    throw te::InputError("--warmup " + std::to_string(a.warmup) + " is not in [0, --steps " +
                         std::to_string(a.steps) + ")");
  }
  if (!(a.lr > 0)) throw te::InputError("--lr " + std::to_string(a.lr) + " is not positive");
  if (a.max_steps < 0 || a.max_steps > a.steps) {
    throw te::InputError("--max-steps " + std::to_string(a.max_steps) + " is not in [0, --steps " +
                         std::to_string(a.steps) + "]");
  }
  if (a.save_every < 0 || a.eval_every < 0 || a.eval_batches < 1) {
    throw te::InputError("--save-every and --eval-every must be >= 0, --eval-batches >= 1");
  }
  if ((a.resume || a.save_every > 0) && a.save_dir.empty()) {
    throw te::InputError(std::string(a.resume ? "--resume" : "--save-every") + " needs --save DIR");
  }
  if (a.peak_tflops && !(*a.peak_tflops > 0)) {
    throw te::InputError("--peak-tflops " + std::to_string(*a.peak_tflops) + " is not positive");
  }
  if (a.schedule == "wsd" && !a.decay_ratio) {
    throw te::InputError("--schedule wsd needs --decay-ratio (the decay's share of the steps)");
  }
}

}  // namespace

int parse_args(int argc, char** argv, Args& a) {
  CLI::App app{
      "te-train: train or fine-tune a decoder language model (Llama, Qwen, Mistral, Phi-3, "
      "Gemma, GPT-2 families) with AdamW (fp32 master weights in bf16 and fp16, fp16 with "
      "dynamic loss scaling; ZeRO-1 with --zero-axis), FP8 recipes (--fp8), a warmup + decay "
      "schedule, global gradient clipping and accumulation, on fixed-length blocks or packed "
      "documents (--pack), on one process or a mesh of ranks; sharded checkpoints that resume "
      "bit for bit; export as Hugging Face files or, from a GGUF model, as GGUF.",
      "te-train"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);  // last wins
  add_model_and_data_options(app, a);
  add_training_options(app, a);
  te::program::add_layout_options(app, a.layout,
                                  "Logical axis rules (default: the vocabulary over the tensor "
                                  "parallel axis, then TE's table)");
  app.add_option("--zero-axis", a.zero_axis,
                 "ZeRO-1: split AdamW's moments and fp32 masters over this mesh axis (the data "
                 "axis, e.g. --mesh data=2 --zero-axis data); checkpoints hold them whole");
  te::program::add_nproc_option(app, a.launch, "te-train");
  te::program::add_threads_option(app, a.launch);
  add_output_options(app, a);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    std::cerr << "te-train: " << e.what() << " (see te-train --help)\n";
    return 2;
  }
  return -1;
}

// The schedule and optimizer options as LmTrainer will take them, checked before anything loads.
void check_schedule(const Args& a) {
  try {
    te::optim::LrSchedule(te::optim::LrScheduleOptions(a.steps)
                              .warmup_steps(a.warmup)
                              .decay_type(a.schedule == "wsd" ? "linear" : a.schedule)
                              .decay_ratio(a.decay_ratio)
                              .lr_min(a.lr_min));
  } catch (const te::Error& e) {
    throw te::InputError("--warmup/--decay-ratio/--lr-min: " + te::program::one_line(e.what()));
  }
  if (a.clip < 0) throw te::InputError("--clip " + std::to_string(a.clip) + " is negative");
  if (a.router_aux_loss && !(*a.router_aux_loss >= 0)) {
    throw te::InputError("--router-aux-loss " + std::to_string(*a.router_aux_loss) +
                         " is negative; give the load-balancing loss's weight, or 0 for none");
  }
  for (const auto& [beta, option] : {std::pair{a.beta1, "--beta1"}, {a.beta2, "--beta2"}}) {
    if (!(beta >= 0 && beta < 1)) {
      throw te::InputError(std::string(option) + " " + std::to_string(beta) + " is outside [0, 1)");
    }
  }
  if (a.weight_decay < 0) throw te::InputError("--weight-decay is negative");
  if (!(a.loss_scale > 0) || !std::isfinite(a.loss_scale)) {
    throw te::InputError("--loss-scale " + std::to_string(a.loss_scale) +
                         " is not positive and finite");
  }
}

int64_t pack_align_of(const Args& a, int64_t cp_ranks) {
  if (!a.pack) return 1;
  if (a.pack_align != 0) return a.pack_align;
  return a.cp_comm_type.empty() ? 1 : 2 * cp_ranks;
}

te::program::Layout check_args(const Args& a, int world_size) {
  check_model(a);
  check_numbers(a);
  check_schedule(a);
  te::program::Layout layout =
      te::program::make_layout(a.layout, world_size, [](const te::MeshResource& resource) {
        return resource.tp ? te::parse_axis_rules("vocab=" + *resource.tp) : te::AxisRules{};
      });
  // Each micro-batch's rows are split over the data-parallel ranks.
  te::program::check_global_batch(layout, a.micro_batch, "--micro-batch");
  if (a.pack && layout.splits_sequence && a.cp_comm_type.empty()) {
    throw te::InputError("--pack: the layout (" + layout.description +
                         ") splits each row's tokens over ranks (sequence parallel); packed rows "
                         "split by rows (data parallel, FSDP), heads (tensor parallel) or, with "
                         "--cp-comm-type, tokens (context parallel)");
  }
  if (!a.cp_comm_type.empty() && !layout.context_parallel) {
    throw te::InputError("--cp-comm-type " + a.cp_comm_type + ": the layout (" +
                         layout.description +
                         ") maps no mesh axis to seqlen_cp; give --mesh-resource cp=AXIS or "
                         "--rules seqlen_cp=AXIS");
  }
  const int64_t chunks = 2 * layout.context_parallel_ranks;
  if (!a.cp_comm_type.empty() && a.seq_len % chunks != 0) {
    throw te::InputError("--seq-len " + std::to_string(a.seq_len) + ": context parallelism over " +
                         std::to_string(layout.context_parallel_ranks) +
                         " ranks cuts each row into 2*cp = " + std::to_string(chunks) +
                         " chunks (TE's load-balanced order); give a multiple of " +
                         std::to_string(chunks));
  }
  if (a.pack_align != 0) {
    if (!a.pack) throw te::InputError("--pack-align: it aligns --pack's documents; add --pack");
    if (a.pack_align < 1) {
      throw te::InputError("--pack-align " + std::to_string(a.pack_align) +
                           ": give a slot multiple of 1 or more");
    }
  }
  if (a.pack && !a.cp_comm_type.empty() &&
      pack_align_of(a, layout.context_parallel_ranks) % (2 * layout.context_parallel_ranks) != 0) {
    throw te::InputError(
        "--pack-align " + std::to_string(a.pack_align) + ": context parallelism over " +
        std::to_string(layout.context_parallel_ranks) +
        " ranks cuts each document's slot into 2*cp = " +
        std::to_string(2 * layout.context_parallel_ranks) + " chunks; give a multiple of it");
  }
  if (a.pack && a.seq_len % pack_align_of(a, layout.context_parallel_ranks) != 0) {
    throw te::InputError("--seq-len " + std::to_string(a.seq_len) + ": --pack's slots are " +
                         std::to_string(pack_align_of(a, layout.context_parallel_ranks)) +
                         " tokens apart (--pack-align" +
                         (a.pack_align == 0 ? ", by default 2*cp" : "") +
                         "), so a row must be a multiple of that");
  }
  if (!a.zero_axis.empty()) {
    const std::vector<std::string> axes =
        layout.mesh ? layout.mesh->names : std::vector<std::string>{};
    if (std::find(axes.begin(), axes.end(), a.zero_axis) == axes.end()) {
      throw te::InputError("--zero-axis: '" + a.zero_axis + "' is not an axis of the mesh (" +
                           layout.description + "); give the data axis of --mesh");
    }
    // ZeRO splits state over the ranks that hold the same parameters with different data.
    const std::optional<te::MeshResource>& r = layout.resource;
    if (r && r->dp != a.zero_axis && r->fsdp != a.zero_axis) {
      throw te::InputError("--zero-axis: '" + a.zero_axis +
                           "' is not the data-parallel axis of --mesh-resource (dp or fsdp); "
                           "ZeRO splits the optimizer state over the data-parallel ranks");
    }
  }
  return layout;
}

}  // namespace train
