// te-encoder: Transformer Engine's encoder example in C++. Trains the CoLA classifier of TE's
// examples/jax/encoder on one process or on a mesh of ranks (threads are not used: one process
// per rank, launched by --nproc through te-run, or by torchrun / te-run / mpirun), with the
// layout chosen only by the mesh, MeshResource and rules on the command line.

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adamw.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "data.h"
#include "model.h"
#include "te/fp8.h"
#include "te/nn.h"
#include "te/runtime.h"

namespace {

// Training batches run through the model before a save to set its FP8 input scales.
constexpr int64_t kCalibrationBatches = 8;
// The commit of TE's examples/jax/encoder this program mirrors (defaults and bars).
constexpr const char* kTeCommit = "d0067d0da";

using encoder::InputError;
using Clock = std::chrono::steady_clock;

struct Args {
  std::string data_dir;
  std::string eval_data;
  int64_t epochs = 3;
  int64_t batch_size = 64;
  int64_t max_seq_len = 32;
  double lr = 1e-4;
  uint64_t seed = 0;
  std::optional<double> dropout;
  double intermediate_dropout = 0.0;
  std::string fp8 = "none";
  bool quantized_weights = false;
  std::string mesh;
  std::string mesh_resource;
  std::string rules;
  bool extend_te_rules = false;
  bool sequence_parallel = false;
  int nproc = 1;
  std::string metrics_json;
  std::string log_steps;
  int threads = 0;
  int64_t max_steps = 0;
  int64_t hidden_size = 256;
  int64_t mlp_hidden_size = 1024;
  int64_t heads = 8;
  std::string mlp_activations = "auto";
  std::string save_dir;
  std::string load_dir;
  bool eval_only = false;
  std::string dtype = "fp32";
  std::string device = "cpu";
  bool quiet = false;
};

// A library message for the command line: one line (a parse error's caret picture dropped,
// its explanation kept), without the [file:line] tag.
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

// ---- layout ------------------------------------------------------------------------------

using MeshSpec = te::MeshShape;

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

// The layout of a run: the mesh (none on one process), MeshResource and rules.
struct Layout {
  std::optional<MeshSpec> mesh;
  std::optional<te::MeshResource> resource;
  std::optional<te::AxisRules> rules;
  std::string description;
  int64_t data_parallel = 1;     // ranks the batch is split over
  bool tensor_parallel = false;  // heads split over some mesh axis
};

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
  } else if (layout.resource || layout.rules) {
    // One process: rules and roles are validated and resolve to nothing.
  }
  // TE's model-parallel example maps its custom Dense axes with user rules extended by TE's
  // table; with a MeshResource and no --rules this program does the same.
  if (layout.resource && (!layout.rules || args.extend_te_rules)) {
    te::AxisRules base;
    if (layout.rules) {
      base = *layout.rules;
    } else {
      const auto& tensor = layout.resource->tpsp ? layout.resource->tpsp : layout.resource->tp;
      base = te::parse_axis_rules("my_broadcast_axis=,my_tp_axis=" + tensor.value_or(""));
    }
    te::MeshResourceScope scope(*layout.resource);
    try {
      layout.rules = te::extend_logical_axis_rules(base);
    } catch (const te::Error& e) {
      throw InputError("--rules: " + one_line(e.what()));
    }
  }
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
  return layout;
}

// ---- output ------------------------------------------------------------------------------

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

std::string duration(double seconds) {
  const int s = static_cast<int>(std::lround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%dh%02dm", s / 3600, (s / 60) % 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof(buf), "%dm%02ds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%ds", s);
  }
  return buf;
}

// A progress bar on a terminal; plain lines about every tenth of the epoch otherwise.
class Progress {
 public:
  Progress(bool enabled, int64_t epoch, int64_t epochs, int64_t steps)
      : enabled_(enabled),
        tty_(isatty(STDOUT_FILENO) != 0),
        epoch_(epoch),
        epochs_(epochs),
        steps_(steps),
        start_(Clock::now()) {}

  void update(int64_t done, double loss, double acc, int64_t samples) {
    if (!enabled_ || steps_ == 0) return;
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    const double rate = elapsed > 0 ? static_cast<double>(samples) / elapsed : 0;
    const double eta = done > 0 ? elapsed * static_cast<double>(steps_ - done) / done : 0;
    const std::string stats = "loss " + fmt("%.4f", loss) + " acc " + fmt("%.4f", acc) + " " +
                              fmt("%.0f", rate) + " samples/s ETA " + duration(eta);
    if (tty_) {
      const int width = 30;
      const int filled = static_cast<int>(width * done / steps_);
      std::cout << "\repoch " << epoch_ << "/" << epochs_ << " ["
                << std::string(static_cast<std::size_t>(filled), '#')
                << std::string(static_cast<std::size_t>(width - filled), '.') << "] " << done << "/"
                << steps_ << " " << stats << "\033[K" << std::flush;
    } else {
      const int64_t every = std::max<int64_t>(1, steps_ / 10);
      if (done % every == 0 || done == steps_) {
        std::cout << "  epoch " << epoch_ << " step " << done << "/" << steps_ << ": " << stats
                  << std::endl;
      }
    }
  }
  void finish() {
    if (enabled_ && tty_) std::cout << "\r\033[K" << std::flush;
  }

 private:
  bool enabled_, tty_;
  int64_t epoch_, epochs_, steps_;
  Clock::time_point start_;
};

// ---- training ----------------------------------------------------------------------------

struct Batch {
  at::Tensor ids, mask, labels;
};

// bf16 compute with fp32 weights and optimiser state (TE's bf16 runs keep fp32 parameters): the
// GEMMs and attention run in bf16 under LibTorch's CPU autocast for the region's lifetime.
// On a GPU, the same through LibTorch's CUDA autocast.
class ComputeDtype {
 public:
  ComputeDtype(bool bf16, bool cuda) : bf16_(bf16), cuda_(cuda) {
    if (bf16_) enable(true);
  }
  ~ComputeDtype() {
    if (bf16_) {
      enable(false);
      at::autocast::clear_cache();
    }
  }
  ComputeDtype(const ComputeDtype&) = delete;
  ComputeDtype& operator=(const ComputeDtype&) = delete;

 private:
  void enable(bool on) const {
#if TE_AUTOCAST_BY_DEVICE
    const at::DeviceType type = cuda_ ? at::kCUDA : at::kCPU;
    at::autocast::set_autocast_dtype(type, at::kBFloat16);
    at::autocast::set_autocast_enabled(type, on);
#else
    if (cuda_) {
      at::autocast::set_autocast_gpu_dtype(at::kBFloat16);
      at::autocast::set_enabled(on);
    } else {
      at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
      at::autocast::set_cpu_enabled(on);
    }
#endif
  }
  bool bf16_;
  bool cuda_;
};

// The device of --device: the CPU, or this rank's GPU (te::local_device(): cuda:LOCAL_RANK).
at::Device device_of(const Args& args) {
  if (args.device == "cpu") return at::Device(at::kCPU);
  const at::Device gpu = te::local_device();
  if (!gpu.is_cuda()) {
    throw encoder::InputError(
        "--device cuda: this LibTorch has no CUDA, or no GPU is visible; "
        "use --device cpu");
  }
  return gpu;
}

// The batch on the run's device (--device).
Batch batch_of(const encoder::Encoded& data, const at::Tensor& index, int64_t max_seq_len,
               const at::Device& device) {
  return {data.ids.index_select(0, index).to(device),
          encoder::padding_mask(data.lengths.index_select(0, index), max_seq_len).to(device),
          data.labels.index_select(0, index).to(device)};
}

struct Evaluation {
  double loss = 0, accuracy = 0, mcc = 0;
  int64_t examples = 0;
};

class Trainer {
 public:
  Trainer(const Args& args, encoder::EncoderClassifier model, std::optional<te::DeviceMesh> mesh)
      : args_(args), model_(std::move(model)), mesh_(std::move(mesh)) {}

  // Logits of a global batch: [B, 2], the same on every rank.
  at::Tensor logits(const Batch& b) {
    ComputeDtype compute(args_.dtype == "bf16", device_of(args_).is_cuda());
    if (!mesh_) return model_->forward(b.ids, b.mask).to(at::kFloat);
    return model_->forward_on_mesh(b.ids, b.mask).full_tensor().to(at::kFloat);
  }

  Evaluation evaluate(const encoder::Encoded& data) {
    model_->eval();
    torch::NoGradGuard no_grad;
    const int64_t n = data.size(), bs = args_.batch_size;
    int64_t tp = 0, tn = 0, fp = 0, fn = 0;
    double loss_sum = 0;
    for (int64_t start = 0; start < n; start += bs) {
      const int64_t len = std::min(bs, n - start);
      // A short last batch is padded to the full batch (its extra rows are ignored), so every
      // layout splits the batch as in training.
      at::Tensor index = at::arange(start, start + bs, at::kLong).clamp_max(n - 1);
      const Batch b = batch_of(data, index, args_.max_seq_len, device_of(args_));
      const at::Tensor out = logits(b).narrow(0, 0, len);
      const at::Tensor labels = b.labels.narrow(0, 0, len);
      loss_sum += at::cross_entropy_loss(out, labels, {}, at::Reduction::Sum).item<double>();
      const at::Tensor pred = out.argmax(1);
      tp += (pred.eq(1) & labels.eq(1)).sum().item<int64_t>();
      tn += (pred.eq(0) & labels.eq(0)).sum().item<int64_t>();
      fp += (pred.eq(1) & labels.eq(0)).sum().item<int64_t>();
      fn += (pred.eq(0) & labels.eq(1)).sum().item<int64_t>();
    }
    model_->train();
    return {loss_sum / double(n), double(tp + tn) / double(n), encoder::matthews(tp, tn, fp, fn),
            n};
  }

  /// FP8 calibration: every GEMM's input and kernel amaxes over the first `batches` training
  /// batches, in eval mode and high precision, become its DelayedScaling scales, so a saved
  /// checkpoint can be served with FP8 weights (te-serve --fp8-weights).
  void calibrate_fp8(const encoder::Encoded& data, int64_t batches,
                     const std::optional<te::MeshResource>& resource) {
    model_->eval();
    torch::NoGradGuard no_grad;
    {
      te::Fp8Autocast calibrate(/*enabled=*/false, te::fp8::DelayedScaling{}, resource,
                                /*calibrating=*/true);
      const int64_t n = data.size(), bs = args_.batch_size;
      for (int64_t i = 0; i < batches && i * bs < n; ++i) {
        at::Tensor index = at::arange(i * bs, (i + 1) * bs, at::kLong).clamp_max(n - 1);
        logits(batch_of(data, index, args_.max_seq_len, device_of(args_)));
      }
    }
    model_->train();
  }

  encoder::EncoderClassifier& model() { return model_; }

 private:
  const Args& args_;
  encoder::EncoderClassifier model_;
  std::optional<te::DeviceMesh> mesh_;
};

std::vector<std::string> fp8_choices() {
  std::vector<std::string> out{"none"};
  for (const std::string& name : te::fp8::recipe_names()) out.push_back(name);
  return out;
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

// Restarts this program as `nproc` ranks under te-run (found next to this executable, in the
// build tree, or on PATH) and returns its exit status.
int spawn_ranks(int nproc, int argc, char** argv) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  std::vector<std::string> candidates;
  if (!ec) candidates.push_back((self.parent_path() / "te-run").string());
#ifdef TE_RUN_BUILD_PATH
  candidates.push_back(TE_RUN_BUILD_PATH);
#endif
  std::string runner = "te-run";
  for (const auto& c : candidates) {
    if (fs::exists(c)) {
      runner = c;
      break;
    }
  }
  std::vector<std::string> args = {runner, "--nproc", std::to_string(nproc), "--",
                                   ec ? std::string(argv[0]) : self.string()};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--nproc") {
      ++i;
      continue;
    }
    if (a.rfind("--nproc=", 0) == 0) continue;
    args.push_back(a);
  }
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  std::cout.flush();
  execvp(cargs[0], cargs.data());
  std::cerr << "te-encoder: cannot start te-run ('" << runner << "'): " << std::strerror(errno)
            << "; install te-run next to te-encoder or put it on PATH\n";
  return 2;
}

struct RunSummary {
  double train_loss = 0, train_accuracy = 0;
  Evaluation dev, extra;
  double seconds = 0, samples_per_second = 0;
  int64_t steps = 0;
};

// The data files of a run, read (and so checked) once, before any rank starts training.
struct ColaData {
  std::string train_file;
  std::vector<encoder::Example> train, dev, extra;
};

ColaData read_data(const Args& args) {
  ColaData d;
  const auto [train_file, dev_file] = encoder::cola_files(args.data_dir);
  d.train_file = train_file;
  d.train = encoder::read_cola_tsv(train_file);
  d.dev = encoder::read_cola_tsv(dev_file);
  if (!args.eval_data.empty()) d.extra = encoder::read_cola_tsv(args.eval_data);
  return d;
}

int train(const Args& args, const Layout& layout, const ColaData& data, int rank, int world_size) {
  const bool lead = rank == 0 && !args.quiet;
  // Every rank holds and tokenises the whole set (0.45 MB); shuffles are seeded alike.
  const auto& train_file = data.train_file;
  const auto& train_examples = data.train;
  const auto& dev_examples = data.dev;
  const auto& extra_examples = data.extra;
  encoder::Vocabulary vocab;
  vocab.add(train_examples);
  vocab.add(dev_examples);
  const auto train_set = encoder::encode(train_examples, vocab, args.max_seq_len);
  const auto dev_set = encoder::encode(dev_examples, vocab, args.max_seq_len);
  std::optional<encoder::Encoded> extra_set;
  if (!extra_examples.empty()) extra_set = encoder::encode(extra_examples, vocab, args.max_seq_len);
  if (train_set.size() < args.batch_size) {
    throw InputError("the training file '" + train_file + "' holds " +
                     std::to_string(train_set.size()) + " examples, fewer than one batch of " +
                     std::to_string(args.batch_size));
  }

  // Mesh and sharding context.
  std::optional<te::DeviceMesh> mesh;
  if (layout.mesh) mesh.emplace(layout.mesh->sizes, layout.mesh->names);
  std::optional<te::MeshScope> mesh_scope;
  if (mesh) mesh_scope.emplace(*mesh);
  std::optional<te::MeshResourceScope> resource_scope;
  if (layout.resource) resource_scope.emplace(*layout.resource);
  std::optional<te::AxisRulesScope> rules_scope;
  if (layout.rules) rules_scope.emplace(*layout.rules);

  const int64_t dp = layout.data_parallel;

  encoder::EncoderOptions options;
  options.vocab_size = vocab.size();
  options.max_seq_len = args.max_seq_len;
  options.hidden_size = args.hidden_size;
  options.mlp_hidden_size = args.mlp_hidden_size;
  options.num_attention_heads = args.heads;
  if (args.dropout) options.hidden_dropout = options.attention_dropout = *args.dropout;
  options.intermediate_dropout = args.intermediate_dropout;
  options.mlp_activations = activations_of(args.mlp_activations, layout.tensor_parallel);
  options.sequence_parallel = args.sequence_parallel;
  te::nn::manual_seed(args.seed);  // the same global weights (and dropout stream) everywhere
  encoder::EncoderClassifier model(options);
  if (mesh) {
    // Logical axes no rule names stay replicated (Flax's fallback); uneven splits are errors.
    const te::nn::ShardingReport report = te::nn::check_sharding(*model);
    if (!report.uneven.empty()) {
      std::string what;
      for (const auto& u : report.uneven) what += (what.empty() ? "" : "; ") + u;
      throw InputError("the layout splits parameters unevenly: " + what +
                       "; choose sizes the mesh axes divide");
    }
  }

  std::string activations;
  for (const auto& a : options.mlp_activations) activations += (activations.empty() ? "" : ",") + a;
  // What a checkpoint must agree on with this run to be loaded into its model.
  const nlohmann::json config = {{"vocabulary", vocab.words()},
                                 {"max_seq_len", args.max_seq_len},
                                 {"hidden_size", args.hidden_size},
                                 {"mlp_hidden_size", args.mlp_hidden_size},
                                 {"heads", args.heads},
                                 {"mlp_activations", activations}};
  if (!args.load_dir.empty()) {
    const auto saved = nlohmann::json::parse(te::nn::load_checkpoint(*model, args.load_dir));
    for (const auto& [key, value] : config.items()) {
      if (!saved.contains(key) || saved[key] != value) {
        throw InputError("--load " + args.load_dir + ": the checkpoint's " + key +
                         " differs from this run's (" +
                         (key == "vocabulary"
                              ? std::string("built from other data")
                              : saved.value(key, nlohmann::json()).dump() + " vs " + value.dump()) +
                         "); use the options and data it was trained with");
      }
    }
    if (lead) std::cout << "loaded " << args.load_dir << std::endl;
  }

  model->to(device_of(args));
  torch::optim::AdamW optimizer(
      model->parameters(),
      torch::optim::AdamWOptions(args.lr).betas({0.9, 0.999}).eps(1e-8).weight_decay(1e-4));
  Trainer trainer(args, model, mesh);
  const auto recipe = recipe_of(args.fp8);
  // Collective (the kernels' amaxes reduced over their ranks); after any --load.
  const int64_t held = args.quantized_weights ? te::nn::quantize_fp8_weights(*model, *recipe) : 0;

  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  if (lead) {
    std::cout << "te-encoder: CoLA " << train_set.size() << " train / " << dev_set.size()
              << " dev sentences, vocabulary " << vocab.size() << ", max_seq_len "
              << args.max_seq_len << " (" << train_set.truncated << " train sentences truncated)\n"
              << "  model: Embedding(" << vocab.size() << ", " << args.hidden_size
              << ") -> TransformerLayer(hidden " << args.hidden_size << ", mlp "
              << args.mlp_hidden_size << " " << activations << ", " << args.heads
              << " heads, dropout " << options.hidden_dropout << "/" << options.attention_dropout
              << "/" << options.intermediate_dropout
              << (args.sequence_parallel ? ", sequence parallel" : "") << ") -> Dense("
              << args.hidden_size << ") x2 -> Dense(2); " << params << " parameters on rank 0\n"
              << "  layout: " << world_size << (world_size == 1 ? " rank, " : " ranks, ")
              << layout.description << ", data-parallel size " << dp << "\n"
              << "  training: " << args.epochs << " epochs, global batch " << args.batch_size
              << ", AdamW lr " << args.lr << " (betas 0.9/0.999, eps 1e-8, weight decay 1e-4), "
              << "seed " << args.seed << ", " << args.dtype << ", fp8 " << args.fp8 << ", "
              << at::get_num_threads() << " threads per rank" << std::endl;
    if (const std::string joined = te::launch_description(); !joined.empty()) {
      std::cout << "  launch: " << joined << std::endl;
    }
    if (args.quantized_weights) {
      std::cout << "  quantized weights: " << held << " GEMM kernels held as E4M3 codes, "
                << te::nn::held_fp8_weight_bytes(*model)
                << " bytes on rank 0 (their fp32 masters in the optimizer)" << std::endl;
    }
  }

  std::ofstream steps_csv;
  std::string steps_tmp;
  if (rank == 0 && !args.log_steps.empty()) {
    steps_tmp = args.log_steps + ".tmp";
    steps_csv.open(steps_tmp);
    if (!steps_csv) throw InputError("cannot write --log-steps '" + args.log_steps + "'");
    steps_csv << "step,epoch,loss,accuracy,samples_per_second\n";
  }

  RunSummary summary;
  at::Generator shuffle = at::detail::createCPUGenerator(args.seed);
  const int64_t steps_per_epoch = train_set.size() / args.batch_size;
  const auto run_start = Clock::now();
  int64_t samples_total = 0;
  bool stop = false;
  if (args.eval_only) {
    summary.dev = trainer.evaluate(dev_set);
    summary.train_loss = summary.train_accuracy = std::nan("");
    if (lead) {
      std::cout << "eval: dev_loss " << fmt("%.4f", summary.dev.loss) << " dev_acc "
                << fmt("%.4f", summary.dev.accuracy) << " dev_mcc " << fmt("%.4f", summary.dev.mcc)
                << std::endl;
    }
  }
  for (int64_t epoch = 1; epoch <= args.epochs && !stop && !args.eval_only; ++epoch) {
    const auto epoch_start = Clock::now();
    const at::Tensor perm = at::randperm(train_set.size(), shuffle, at::kLong);
    Progress progress(lead, epoch, args.epochs, steps_per_epoch);
    double loss_sum = 0, acc_sum = 0;
    int64_t done = 0;
    for (int64_t step = 0; step < steps_per_epoch; ++step) {
      const auto step_start = Clock::now();
      const Batch b = batch_of(train_set, perm.narrow(0, step * args.batch_size, args.batch_size),
                               args.max_seq_len, device_of(args));
      at::Tensor loss, out;
      optimizer.zero_grad();
      {
        std::optional<te::Fp8Autocast> fp8;
        if (recipe) fp8.emplace(true, *recipe, layout.resource);
        out = trainer.logits(b);
        loss = at::cross_entropy_loss(out, b.labels);
        te::GradientBuckets buckets;
        loss.backward();
        buckets.finish();
      }
      optimizer.step();
      if (args.quantized_weights) te::nn::requantize_fp8_weights(*model);
      const double l = loss.item<double>();
      const double acc = out.detach().argmax(1).eq(b.labels).to(at::kDouble).mean().item<double>();
      if (!std::isfinite(l)) {
        throw std::runtime_error("the training loss became " + std::to_string(l) + " at step " +
                                 std::to_string(summary.steps + 1));
      }
      loss_sum += l;
      acc_sum += acc;
      ++done;
      ++summary.steps;
      samples_total += args.batch_size;
      const double step_s = std::chrono::duration<double>(Clock::now() - step_start).count();
      if (steps_csv.is_open()) {
        char line[160];
        std::snprintf(line, sizeof(line), "%lld,%lld,%.9g,%.9g,%.1f\n",
                      static_cast<long long>(summary.steps), static_cast<long long>(epoch), l, acc,
                      step_s > 0 ? args.batch_size / step_s : 0.0);
        steps_csv << line;
      }
      progress.update(done, loss_sum / done, acc_sum / done, done * args.batch_size);
      if (args.max_steps > 0 && summary.steps >= args.max_steps) {
        stop = true;
        break;
      }
    }
    progress.finish();
    summary.train_loss = loss_sum / std::max<int64_t>(done, 1);
    summary.train_accuracy = acc_sum / std::max<int64_t>(done, 1);
    summary.dev = trainer.evaluate(dev_set);
    const double epoch_s = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    if (lead) {
      std::cout << "epoch " << epoch << ": train_loss " << fmt("%.4f", summary.train_loss)
                << " train_acc " << fmt("%.4f", summary.train_accuracy) << " dev_loss "
                << fmt("%.4f", summary.dev.loss) << " dev_acc " << fmt("%.4f", summary.dev.accuracy)
                << " dev_mcc " << fmt("%.4f", summary.dev.mcc) << " time " << fmt("%.1f", epoch_s)
                << "s" << std::endl;
    }
  }
  summary.seconds = std::chrono::duration<double>(Clock::now() - run_start).count();
  summary.samples_per_second = samples_total / summary.seconds;
  if (extra_set) {
    summary.extra = trainer.evaluate(*extra_set);
    if (lead) {
      std::cout << "eval " << args.eval_data << ": loss " << fmt("%.4f", summary.extra.loss)
                << " acc " << fmt("%.4f", summary.extra.accuracy) << " mcc "
                << fmt("%.4f", summary.extra.mcc) << std::endl;
    }
  }
  if (!args.save_dir.empty() && !args.eval_only) {
    nlohmann::json extra = config;
    extra["steps"] = summary.steps;
    extra["seed"] = args.seed;
    trainer.calibrate_fp8(train_set, kCalibrationBatches, layout.resource);
    te::nn::save_checkpoint(*model, args.save_dir, extra.dump());
    if (lead) std::cout << "saved " << args.save_dir << std::endl;
  }
  if (lead) {
    std::cout << "done: " << summary.steps << " steps in " << fmt("%.1f", summary.seconds) << "s, "
              << fmt("%.1f", summary.samples_per_second) << " samples/s" << std::endl;
  }
  if (steps_csv.is_open()) {
    steps_csv.close();
    std::filesystem::rename(steps_tmp, args.log_steps);
  }
  if (rank == 0 && !args.metrics_json.empty()) {
    nlohmann::json j = {{"train_loss", summary.train_loss},
                        {"train_accuracy", summary.train_accuracy},
                        {"dev_loss", summary.dev.loss},
                        {"dev_accuracy", summary.dev.accuracy},
                        {"dev_mcc", summary.dev.mcc},
                        {"epochs", args.epochs},
                        {"steps", summary.steps},
                        {"world_size", world_size},
                        {"mesh", layout.mesh ? layout.mesh->to_string() : ""},
                        {"mesh_resource", layout.resource ? te::to_string(*layout.resource) : ""},
                        {"rules", args.rules},
                        {"sequence_parallel", args.sequence_parallel},
                        {"mlp_activations", activations},
                        {"intermediate_dropout", args.intermediate_dropout},
                        {"te_commit", kTeCommit},
                        {"fp8", args.fp8},
                        {"quantized_weights", args.quantized_weights},
                        {"dtype", args.dtype},
                        {"seed", args.seed},
                        {"batch_size", args.batch_size},
                        {"max_seq_len", args.max_seq_len},
                        {"seconds", summary.seconds},
                        {"samples_per_second", summary.samples_per_second}};
    if (extra_set) {
      j["eval"] = {{"file", args.eval_data},
                   {"loss", summary.extra.loss},
                   {"accuracy", summary.extra.accuracy},
                   {"mcc", summary.extra.mcc}};
    }
    const std::string tmp = args.metrics_json + ".tmp";
    {
      std::ofstream out(tmp);
      if (!out) throw std::runtime_error("cannot write --metrics-json '" + args.metrics_json + "'");
      out << j.dump(2) << "\n";
    }
    std::filesystem::rename(tmp, args.metrics_json);
    if (lead) std::cout << "metrics: " << args.metrics_json << std::endl;
  }
  return 0;
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

int main(int argc, char** argv) {
  Args args;
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "te-encoder: " << e.what() << " (see te-encoder --help)\n";
    return 2;
  }

  // Under a launcher (torchrun, te-run, mpirun, srun) this process is one rank of its world.
  std::optional<te::LaunchEnvironment> launch;
  try {
    launch = te::read_launch_environment();
  } catch (const te::Error& e) {
    std::cerr << "te-encoder: " << one_line(e.what()) << "\n";
    return 2;
  }
  const bool launched = launch.has_value();
  const int world_size = launched ? launch->world_size : args.nproc;
  if (launched && args.nproc > 1 && args.nproc != world_size) {
    std::cerr << "te-encoder: --nproc " << args.nproc << " differs from the launcher's world of "
              << world_size << " ranks; drop --nproc under a launcher\n";
    return 2;
  }
  Layout layout;
  ColaData data;
  try {
    if (args.hidden_size % args.heads != 0) {
      throw InputError("--hidden-size " + std::to_string(args.hidden_size) +
                       " is not a multiple of --heads " + std::to_string(args.heads));
    }
    layout = make_layout(args, world_size);
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
    // Read the data before starting ranks: a bad file is one message, not one per rank. (te-run's
    // ranks read it again, each in its own process.)
    data = read_data(args);
    if (args.mlp_activations != "auto") activations_of(args.mlp_activations, false);
  } catch (const InputError& e) {
    std::cerr << "te-encoder: " << e.what() << "\n";
    return 2;
  }
  if (!launched && args.nproc > 1) return spawn_ranks(args.nproc, argc, argv);

  try {
    if (args.threads > 0) {
      at::set_num_threads(args.threads);
    } else {
      te::configure_threads();
    }
    int rank = 0;
    if (launched && world_size > 1) {
      te::init_distributed();
      rank = te::world_rank();
    }
    const int status = train(args, layout, data, rank, world_size);
    if (launched && world_size > 1) te::shutdown_distributed();
    return status;
  } catch (const InputError& e) {
    std::cerr << "te-encoder: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "te-encoder: " << e.what() << "\n";
    return 1;
  }
}
