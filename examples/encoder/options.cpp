#include "options.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "te/nn.h"
#include "te/program/report.h"

namespace encoder {

namespace {

std::string default_data_dir() {
#ifdef TE_ENCODER_DATA_DIR
  if (std::filesystem::is_directory(TE_ENCODER_DATA_DIR)) return TE_ENCODER_DATA_DIR;
#endif
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const auto installed = self.parent_path().parent_path() / "share" / "te" / "encoder" / "cola";
    if (std::filesystem::is_directory(installed)) return installed.string();
  }
  return "examples/encoder/data/cola";
}

// TE's model-parallel example maps its custom Dense axes with user rules extended by TE's
// table; with a MeshResource and no --rules this program does the same: my_tp_axis where TE's
// table puts the heads, my_broadcast_axis replicated.
te::AxisRules dense_axis_rules(const te::MeshResource& resource) {
  const te::AxisRules table = te::te_default_axis_rules(resource);
  const auto heads = std::find_if(table.begin(), table.end(), [](const te::AxisRule& r) {
    return r.logical == te::axis::kHeads;
  });
  return te::parse_axis_rules(
      "my_broadcast_axis=,my_tp_axis=" +
      (heads != table.end() && !heads->mesh.empty() ? heads->mesh[0] : std::string()));
}

}  // namespace

Layout make_layout(const Args& args, int world_size) {
  Layout layout = te::program::make_layout(args.layout, world_size, dense_axis_rules);
  te::program::check_global_batch(layout, args.batch_size);
  return layout;
}

std::vector<std::string> activations_of(const std::string& text, bool tensor_parallel) {
  if (text == "auto") {
    return tensor_parallel ? std::vector<std::string>{"gelu", "linear"}
                           : std::vector<std::string>{"gelu"};
  }
  std::vector<std::string> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  try {
    te::nn::functional::mlp_activation(at::zeros({1, static_cast<int64_t>(out.size()), 1}), out);
  } catch (const te::Error& e) {
    throw InputError("--mlp-activations '" + text + "': " + te::program::one_line(e.what()));
  }
  return out;
}

namespace {

// The data, the schedule and the precision.
void add_training_options(CLI::App& app, Args& args) {
  app.add_option("--data", args.data_dir,
                 "GLUE-style CoLA directory: in_domain_train.tsv + in_domain_dev.tsv, or "
                 "train.tsv + dev.tsv (no header; label in column 2, sentence in column 4). "
                 "Default: the vendored CoLA v1.1");
  app.add_option("--eval-data", args.eval_data,
                 "Evaluate one more TSV file (same format) after training");
  app.add_option("--epochs", args.epochs, "Training epochs")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", args.batch_size,
                 "Global batch size (split over the data-parallel ranks)")
      ->check(CLI::PositiveNumber);
  app.add_option("--max-seq-len", args.max_seq_len, "Tokens per sentence (truncated / padded)")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr", args.lr, "AdamW learning rate")->check(CLI::PositiveNumber);
  app.add_option("--seed", args.seed, "Seed of the weights, the dropout masks and the shuffles");
  app.add_option("--dropout", args.dropout,
                 "Overrides the hidden and attention dropout rates (TE: 0.1 each)")
      ->check(CLI::Range(0.0, 0.999));
  app.add_option("--intermediate-dropout", args.intermediate_dropout,
                 "Dropout after the MLP's first GEMM (TE since 7a5859834: 0; before it: 0.1)")
      ->check(CLI::Range(0.0, 0.999));
  te::program::add_fp8_option(app, args.fp8);
  app.add_flag("--quantized-weights", args.quantized_weights,
               "Hold the GEMM kernels as FP8 codes between steps (TE's quantized_model_init): "
               "the GEMMs multiply them, FSDP gathers them (a quarter of fp32's bytes), AdamW "
               "steps the fp32 masters and the codes are cast again after each step; with --fp8 "
               "current or delayed");
}

// The layout (mesh, roles, rules) and the ranks.
void add_layout_options(CLI::App& app, Args& args) {
  te::program::add_layout_options(
      app, args.layout,
      "Logical axis rules, e.g. 'batch=data,heads=model,my_tp_axis=model'. Without them, a "
      "--mesh-resource maps the example's Dense axes (my_tp_axis to the tp/tpsp axis, "
      "my_broadcast_axis replicated) extended with TE's table");
  app.add_flag("--sequence-parallel", args.sequence_parallel,
               "Sequence parallelism in the TransformerLayer (needs tpsp or a seqlen_tp rule)");
  app.add_option("--cp-comm-type", args.cp_comm_type,
                 "Context parallelism (TE's cp_comm_type: p2p, all_gather, a2a or a2a+p2p): the "
                 "layer's attention runs over sentences whose tokens split over the mesh axis the "
                 "rules give seqlen_cp (--mesh-resource cp=AXIS, or a seqlen_cp rule; a2a+p2p: "
                 "two axes, seqlen_cp=(RING,A2A)); --max-seq-len a multiple of their size")
      ->check(CLI::IsMember(te::nn::te_names<te::nn::CpCommType>()));
  te::program::add_nproc_option(app, args.launch, "te-encoder");
}

// What the run writes, the model's size, checkpoints and the device.
void add_output_and_model_options(CLI::App& app, Args& args) {
  app.add_option("--metrics-json", args.metrics_json,
                 "Write the final metrics (train_loss, train_accuracy, dev_loss, dev_accuracy, "
                 "dev_mcc, epochs, world_size, mesh, fp8, seconds, samples_per_second) here");
  app.add_option("--log-steps", args.log_steps,
                 "Write one CSV line per step (step, epoch, loss, accuracy, samples/s) here");
  te::program::add_threads_option(app, args.launch);
  app.add_option("--max-steps", args.max_steps, "Stop after this many steps (0: all epochs)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--hidden-size", args.hidden_size, "Model width (TE: 256)")
      ->check(CLI::PositiveNumber);
  app.add_option("--mlp-hidden-size", args.mlp_hidden_size, "MLP width (TE: 1024)")
      ->check(CLI::PositiveNumber);
  app.add_option("--heads", args.heads, "Attention heads (TE: 8)")->check(CLI::PositiveNumber);
  app.add_option("--mlp-activations", args.mlp_activations,
                 "MLP activations, e.g. relu or gelu,linear (gated). auto: gelu (TE's "
                 "TransformerLayer default since 7a5859834, kept by its single-GPU, data-parallel "
                 "and multi-process examples; relu before it), gelu,linear when the layout is "
                 "tensor parallel (TE's model-parallel example)");
  app.add_option("--dtype", args.dtype,
                 "Compute dtype: fp32, or bf16 (GEMMs and attention in bf16 under LibTorch's CPU "
                 "autocast; weights, optimiser state and loss stay fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--save", args.save_dir,
                 "Save the trained model here (te::nn::save_checkpoint: safetensors pieces written "
                 "by every rank, an index, atomically; with the vocabulary, the model options and "
                 "FP8 input scales calibrated on 8 training batches, for te-serve --fp8-weights)");
  app.add_option("--load", args.load_dir,
                 "Load a checkpoint before training (any layout it was saved on; the data and "
                 "model options must be the ones it was trained with). Weights only: the "
                 "optimiser starts afresh");
  app.add_flag("--eval-only", args.eval_only, "With --load: evaluate the dev set, do not train");
  app.add_option("--device", args.device,
                 "cpu, or cuda: this rank's GPU (cuda:LOCAL_RANK under te-run); collectives of "
                 "CUDA tensors run on NCCL")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_flag("--quiet", args.quiet, "Print nothing but errors");
}

}  // namespace

int parse_args(int argc, char** argv, Args& args) {
  args.data_dir = default_data_dir();
  CLI::App app{
      "te-encoder: Transformer Engine's encoder example (CoLA sentence classification) on te-cpp,\n"
      "mirroring TE's examples/jax/encoder at commit d0067d0da (2026-08): its model, defaults "
      "(gelu, dropout 0.1 on attention and hidden, none after FC1) and accuracy bars.\n"
      "One process by default; --nproc N starts N ranks through te-run (or run it under "
      "torchrun, te-run or mpirun). The layout comes only from --mesh, --mesh-resource and "
      "--rules.\n\nExamples:\n"
      "  te-encoder                                         # one process, 3 epochs\n"
      "  te-encoder --nproc 2 --mesh data=2 --mesh-resource dp=data --batch-size 512 --epochs 5\n"
      "  te-encoder --nproc 4 --mesh data=2,model=2 --mesh-resource dp=data,tpsp=model \\\n"
      "             --batch-size 256 --max-seq-len 64 --epochs 5 --sequence-parallel\n"
      "  te-encoder --nproc 2 --mesh cp=2 --mesh-resource cp=cp --cp-comm-type p2p\n"
      "  te-encoder --nproc 2 --mesh data=2 --mesh-resource fsdp=data --batch-size 512 --epochs 5\n"
      "  te-encoder --fp8 delayed --metrics-json metrics.json --log-steps steps.csv",
      "te-encoder"};
  app.option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  add_training_options(app, args);
  add_layout_options(app, args);
  add_output_and_model_options(app, args);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "te-encoder: " << e.what() << " (see te-encoder --help)\n";
    return 2;
  }
  return -1;
}

Layout check_args(const Args& args, int world_size) {
  if (args.hidden_size % args.heads != 0) {
    throw InputError("--hidden-size " + std::to_string(args.hidden_size) +
                     " is not a multiple of --heads " + std::to_string(args.heads));
  }
  Layout layout = make_layout(args, world_size);
  if (!args.cp_comm_type.empty() && !layout.context_parallel) {
    throw InputError("--cp-comm-type " + args.cp_comm_type + ": the layout (" + layout.description +
                     ") maps no mesh axis to seqlen_cp; give --mesh-resource cp=AXIS or a "
                     "seqlen_cp rule");
  }
  if (args.quantized_weights && args.fp8 != "delayed" && args.fp8 != "current") {
    throw InputError(
        "--quantized-weights holds the kernels with a per-tensor FP8 recipe; "
        "add --fp8 current (or delayed)" +
        (args.fp8 == "none" ? std::string() : ", not --fp8 " + args.fp8 + " (it scales blocks)"));
  }
  if (args.eval_only && args.load_dir.empty()) {
    throw InputError("--eval-only needs --load DIR (a checkpoint to evaluate)");
  }
  if (!args.load_dir.empty() && !std::filesystem::exists(std::filesystem::path(args.load_dir) /
                                                         "model.safetensors.index.json")) {
    throw InputError("--load '" + args.load_dir + "' holds no checkpoint (no " +
                     "model.safetensors.index.json); give a directory --save wrote");
  }
  return layout;
}

}  // namespace encoder
