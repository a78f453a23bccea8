#pragma once

// te-train's command line (options.cpp) and the run it describes (run.cpp).

#include <cstdint>
#include <optional>
#include <string>

#include "te/program/launch.h"
#include "te/program/layout.h"

namespace train {

struct Args {
  // The model: a Hugging Face directory or a GGUF file to fine-tune, or a config.json to start
  // from random weights (with --tokenizer).
  std::string model;
  std::string config;
  std::string tokenizer;
  // Data.
  std::string data;
  std::string eval_data;
  double eval_fraction = 0.0;
  std::string data_format = "auto";  // auto, text, jsonl or chat
  std::string text_field = "text";   // a JSON line's text
  // Batches and steps.
  int64_t steps = 0;
  int64_t max_steps = 0;  // stop after this step (0: --steps); the schedule spans --steps
  int64_t seq_len = 256;
  bool pack = false;         // --pack: documents packed into rows (THD), each attending to itself
  int64_t pack_align = 0;    // --pack-align: each document's slot a multiple (0: 2·cp, or 1)
  std::string cp_comm_type;  // --cp-comm-type: context parallelism's strategy ("": none)
  int64_t micro_batch = 4;   // rows per micro-batch
  int64_t global_batch_tokens = 0;  // 0: one micro-batch per step
  // Optimizer and schedule.
  double lr = 3e-4;
  double lr_min = 0.1;
  int64_t warmup = 0;
  std::string schedule = "cosine";
  std::optional<double> decay_ratio;  // WSD: the decay's share of the steps
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95;
  double clip = 1.0;
  std::string dtype = "fp32";
  double loss_scale = 65536;  // --loss-scale: fp16's initial loss scale
  // --router-aux-loss: the router's load-balancing loss weight (a mixture of experts); unset:
  // the config's (router_aux_loss_coef when output_router_logits)
  std::optional<double> router_aux_loss;
  std::string fp8 = "none";  // --fp8: none, or a te::fp8 recipe by name
  uint64_t seed = 0;
  // Layout and launch (te::program's --mesh, --mesh-resource, --rules; --nproc, --threads).
  te::program::LayoutArgs layout;
  std::string zero_axis;  // --zero-axis: ZeRO-1 over this mesh axis
  te::program::LaunchArgs launch;
  // Checkpoints, evaluation, outputs.
  std::string save_dir;
  int64_t save_every = 0;
  bool resume = false;
  int64_t eval_every = 0;
  int64_t eval_batches = 8;
  std::string export_hf;
  std::string export_gguf;
  std::string export_gguf_type = "f16";
  std::string log_steps;
  std::string metrics_json;
  int64_t log_every = 10;
  std::optional<double> peak_tflops;  // --peak-tflops: the run's peak, not measured
  bool quiet = false;
  bool plan = false;  // --plan: print what a step needs on each rank and exit
};

/// Reads the command line into `args`: -1 to go on, else the exit status (--help 0, a malformed
/// command line 2 after saying why).
int parse_args(int argc, char** argv, Args& args);

/// The checks that need no file and no rank (te::InputError naming the option); returns the
/// layout for `world_size` ranks.
te::program::Layout check_args(const Args& args, int world_size);

/// --pack's slot multiple: --pack-align, or 2·cp under context parallelism over `cp_ranks`
/// (TE's pad_thd_sequences_for_cp), else 1.
int64_t pack_align_of(const Args& args, int64_t cp_ranks);

/// The run on this rank, under the layout's mesh, MeshResource and rules: exit status.
int run(const Args& args, const te::program::Layout& layout, int rank, int world_size);

}  // namespace train
