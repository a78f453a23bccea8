#include "options.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "te/nn.h"

namespace encoder {

namespace {

MeshSpec parse_mesh(const std::string& text) {
  try {
    return te::parse_mesh_shape(text);
  } catch (const te::Error& e) {
    throw InputError(std::string("--") + e.what());
  }
}

// Every mesh axis a MeshResource or rule names must be an axis of the mesh.
void check_axis(const MeshSpec& mesh, const std::string& axis, const std::string& where) {
  if (std::find(mesh.names.begin(), mesh.names.end(), axis) != mesh.names.end()) return;
  std::string have;
  for (const auto& n : mesh.names) have += (have.empty() ? "" : ", ") + n;
  throw InputError(where + " names mesh axis '" + axis + "', which the mesh (" + mesh.to_string() +
                   ") lacks; its axes are: " + have);
}

std::vector<std::string> fp8_choices() {
  std::vector<std::string> out{"none"};
  for (const std::string& name : te::fp8::recipe_names()) out.push_back(name);
  return out;
}

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

}  // namespace

std::string one_line(const std::string& message) {
  std::vector<std::string> lines;
  std::stringstream in(message);
  std::string line;
  while (std::getline(in, line)) {
    const auto start = line.find_first_not_of(' ');
    if (start != std::string::npos) lines.push_back(line.substr(start));
  }
  if (lines.empty()) return message;
  std::string out = lines.front();
  if (lines.size() > 1) out += "; " + lines.back();
  const auto tag = out.rfind(" [");
  if (tag != std::string::npos && out.back() == ']') out.erase(tag);
  return out;
}

namespace {

// The mesh axes the mesh resource and the rules name exist on --mesh, and one of them is given.
void check_layout_axes(const Layout& layout) {
  if (layout.mesh) {
    if (!layout.resource && !layout.rules) {
      throw InputError("--mesh " + layout.mesh->to_string() +
                       " needs --mesh-resource or --rules to map the model's logical axes onto "
                       "it (e.g. --mesh-resource dp=data)");
    }
    if (layout.resource) {
      const te::MeshResource& r = *layout.resource;
      for (const te::MeshRole& role : te::kMeshRoles) {
        if (r.*role.axis) check_axis(*layout.mesh, *(r.*role.axis), "--mesh-resource");
      }
    }
    if (layout.rules) {
      for (const te::AxisRule& rule : *layout.rules) {
        for (const std::string& axis : rule.mesh) {
          check_axis(*layout.mesh, axis, "--rules entry '" + te::to_string(rule) + "'");
        }
      }
    }
  }
  // One process: rules and roles are validated and resolve to nothing.
}

// TE's model-parallel example maps its custom Dense axes with user rules extended by TE's
// table; with a MeshResource and no --rules this program does the same.
void extend_with_te_table(const Args& args, Layout& layout) {
  if (!layout.resource || (layout.rules && !args.extend_te_rules)) return;
  // TE's table reads the mesh's axis sizes (a role on an axis of one device is inactive).
  std::optional<te::MeshShapeScope> sizes;
  if (layout.mesh) sizes.emplace(*layout.mesh);
  te::MeshResourceScope scope(*layout.resource);
  try {
    te::AxisRules base;
    if (layout.rules) {
      base = *layout.rules;
    } else {  // my_tp_axis where TE's table puts the heads
      const te::AxisRules table = te::te_default_axis_rules(*layout.resource);
      const auto heads = std::find_if(table.begin(), table.end(), [](const te::AxisRule& r) {
        return r.logical == te::axis::kHeads;
      });
      base = te::parse_axis_rules(
          "my_broadcast_axis=,my_tp_axis=" +
          (heads != table.end() && !heads->mesh.empty() ? heads->mesh[0] : std::string()));
    }
    layout.rules = te::extend_logical_axis_rules(base);
  } catch (const te::Error& e) {
    throw InputError("--rules: " + one_line(e.what()));
  }
}

// The data-parallel size and whether the heads are split (what the rules make of the model's
// batch and heads), checked against --batch-size, and the line that describes the layout.
void measure_layout(const Args& args, Layout& layout) {
  if (layout.mesh) {
    std::optional<te::MeshResourceScope> resource;
    if (layout.resource) resource.emplace(*layout.resource);
    std::optional<te::AxisRulesScope> rules;
    if (layout.rules) rules.emplace(*layout.rules);
    if (const auto spec = te::resolve_logical_axes({"batch", "heads"})) {
      for (const auto& axis : (*spec)[0]) {
        const auto it = std::find(layout.mesh->names.begin(), layout.mesh->names.end(), axis);
        layout.data_parallel *= layout.mesh->sizes[std::size_t(it - layout.mesh->names.begin())];
      }
      layout.tensor_parallel = !(*spec)[1].empty();
    }
    if (args.batch_size % layout.data_parallel != 0) {
      throw InputError("--batch-size " + std::to_string(args.batch_size) +
                       " (the global batch) is not divisible by the data-parallel size " +
                       std::to_string(layout.data_parallel));
    }
    layout.description = "mesh " + layout.mesh->to_string();
    if (layout.resource) layout.description += ", mesh resource " + te::to_string(*layout.resource);
    if (!args.rules.empty()) layout.description += ", rules " + args.rules;
  } else {
    layout.description = "one process";
  }
}

}  // namespace

Layout make_layout(const Args& args, int world_size) {
  Layout layout;
  if (!args.mesh.empty()) {
    layout.mesh = parse_mesh(args.mesh);
  } else if (world_size > 1) {
    layout.mesh = MeshSpec{{world_size}, {"data"}};  // data parallel by default
  }
  if (layout.mesh && layout.mesh->size() != world_size) {
    throw InputError("--mesh " + layout.mesh->to_string() + " has " +
                     std::to_string(layout.mesh->size()) + " ranks but the world has " +
                     std::to_string(world_size) +
                     (world_size == 1 ? " (start ranks with --nproc N or a launcher)" : ""));
  }
  if (!args.mesh_resource.empty()) {
    try {
      layout.resource = te::parse_mesh_resource(args.mesh_resource);
    } catch (const te::Error& e) {
      throw InputError("--mesh-resource: " + one_line(e.what()));
    }
  } else if (layout.mesh && args.mesh.empty() && args.rules.empty()) {
    layout.resource = te::parse_mesh_resource("dp=data");
  }
  if (!args.rules.empty()) {
    try {
      layout.rules = te::parse_axis_rules(args.rules);
    } catch (const te::Error& e) {
      throw InputError("--rules: " + one_line(e.what()));
    }
  }
  if (args.extend_te_rules && !layout.resource) {
    throw InputError("--extend-te-rules needs --mesh-resource (TE's table is derived from it)");
  }
  check_layout_axes(layout);
  extend_with_te_table(args, layout);
  measure_layout(args, layout);
  return layout;
}

std::optional<te::fp8::Recipe> recipe_of(const std::string& name) {
  if (name == "none") return std::nullopt;
  return te::fp8::recipe_named(name);
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
    throw InputError("--mlp-activations '" + text + "': " + one_line(e.what()));
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
  app.add_option("--fp8", args.fp8, "FP8 GEMMs: none, or a recipe: " + te::fp8::recipe_summary())
      ->check(CLI::IsMember(fp8_choices()));
  app.add_flag("--quantized-weights", args.quantized_weights,
               "Hold the GEMM kernels as FP8 codes between steps (TE's quantized_model_init): "
               "the GEMMs multiply them, FSDP gathers them (a quarter of fp32's bytes), AdamW "
               "steps the fp32 masters and the codes are cast again after each step; with --fp8 "
               "current or delayed");
}

// The layout (mesh, roles, rules) and the ranks.
void add_layout_options(CLI::App& app, Args& args) {
  app.add_option("--mesh", args.mesh,
                 "Device mesh, e.g. data=2,model=2 (its size must equal the number of ranks; "
                 "default with several ranks: data=N)");
  app.add_option("--mesh-resource", args.mesh_resource,
                 "Parallelism roles of the mesh axes (TE's MeshResource), e.g. dp=data,tpsp=model "
                 "or fsdp=data (default with several ranks and no --mesh: dp=data)");
  app.add_option("--rules", args.rules,
                 "Logical axis rules, e.g. 'batch=data,heads=model,my_tp_axis=model'. Without "
                 "them, a --mesh-resource maps the example's Dense axes (my_tp_axis to the tp/tpsp "
                 "axis, my_broadcast_axis replicated) extended with TE's table");
  app.add_flag("--extend-te-rules", args.extend_te_rules,
               "Extend --rules with TE's default table derived from --mesh-resource");
  app.add_flag("--sequence-parallel", args.sequence_parallel,
               "Sequence parallelism in the TransformerLayer (needs tpsp or a seqlen_tp rule)");
  app.add_option("--nproc", args.nproc,
                 "Start this many local ranks through te-run (across machines, start te-encoder "
                 "under te-run --nnodes, torchrun, srun or mpirun instead: README)")
      ->check(CLI::PositiveNumber);
}

// What the run writes, the model's size, checkpoints and the device.
void add_output_and_model_options(CLI::App& app, Args& args) {
  app.add_option("--metrics-json", args.metrics_json,
                 "Write the final metrics (train_loss, train_accuracy, dev_loss, dev_accuracy, "
                 "dev_mcc, epochs, world_size, mesh, fp8, seconds, samples_per_second) here");
  app.add_option("--log-steps", args.log_steps,
                 "Write one CSV line per step (step, epoch, loss, accuracy, samples/s) here");
  app.add_option("--threads", args.threads,
                 "Intra-op threads per rank (default: OMP_NUM_THREADS, else the core count)")
      ->check(CLI::NonNegativeNumber);
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
