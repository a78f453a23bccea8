#include "trainer.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "te/encoder/data.h"
#include "te/encoder/model.h"
#include "te/fp8.h"
#include "te/nn.h"
#include "te/program/report.h"
#include "te/runtime.h"

namespace encoder {

namespace {

using te::program::Clock;
using te::program::fmt;
using te::program::Progress;
using te::program::StepLog;

// Training batches run through the model before a save to set its FP8 input scales.
constexpr int64_t kCalibrationBatches = 8;

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
    throw InputError(
        "--device cuda: this LibTorch has no CUDA, or no GPU is visible; "
        "use --device cpu");
  }
  return gpu;
}

// The batch on the run's device (--device).
Batch batch_of(const Encoded& data, const at::Tensor& index, int64_t max_seq_len,
               const at::Device& device) {
  return {data.ids.index_select(0, index).to(device),
          padding_mask(data.lengths.index_select(0, index), max_seq_len).to(device),
          data.labels.index_select(0, index).to(device)};
}

class Trainer {
 public:
  Trainer(const Args& args, EncoderClassifier model, std::optional<te::DeviceMesh> mesh)
      : args_(args), model_(std::move(model)), mesh_(std::move(mesh)) {}

  // Logits of a global batch: [B, 2], the same on every rank.
  at::Tensor logits(const Batch& b) {
    ComputeDtype compute(args_.dtype == "bf16", device_of(args_).is_cuda());
    if (!mesh_) return model_->forward(b.ids, b.mask).to(at::kFloat);
    return model_->forward_on_mesh(b.ids, b.mask).full_tensor().to(at::kFloat);
  }

  Evaluation evaluate(const Encoded& data) {
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
    return {loss_sum / double(n), double(tp + tn) / double(n), matthews(tp, tn, fp, fn), n};
  }

  /// FP8 calibration: every GEMM's input and kernel amaxes over the first `batches` training
  /// batches, in eval mode and high precision, become its DelayedScaling scales, so a saved
  /// checkpoint can be served with FP8 weights (te-serve --fp8-weights).
  void calibrate_fp8(const Encoded& data, int64_t batches,
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

  EncoderClassifier& model() { return model_; }

 private:
  const Args& args_;
  EncoderClassifier model_;
  std::optional<te::DeviceMesh> mesh_;
};

}  // namespace

ColaData read_data(const Args& args) {
  ColaData d;
  const auto [train_file, dev_file] = cola_files(args.data_dir);
  d.train_file = train_file;
  d.train = read_cola_tsv(train_file);
  d.dev = read_cola_tsv(dev_file);
  if (!args.eval_data.empty()) d.extra = read_cola_tsv(args.eval_data);
  return d;
}

namespace {

// The run's sentences as padded ids: every rank holds and tokenises the whole set (0.45 MB);
// shuffles are seeded alike.
struct Sets {
  Vocabulary vocab;
  Encoded train, dev;
  std::optional<Encoded> extra;
};

Sets encode_sets(const Args& args, const ColaData& data) {
  Sets s;
  s.vocab.add(data.train);
  s.vocab.add(data.dev);
  s.train = encode(data.train, s.vocab, args.max_seq_len);
  s.dev = encode(data.dev, s.vocab, args.max_seq_len);
  if (!data.extra.empty()) s.extra = encode(data.extra, s.vocab, args.max_seq_len);
  if (s.train.size() < args.batch_size) {
    throw InputError("the training file '" + data.train_file + "' holds " +
                     std::to_string(s.train.size()) + " examples, fewer than one batch of " +
                     std::to_string(args.batch_size));
  }
  return s;
}

EncoderOptions model_options(const Args& args, const Layout& layout, int64_t vocab_size) {
  EncoderOptions options;
  options.vocab_size = vocab_size;
  options.max_seq_len = args.max_seq_len;
  options.hidden_size = args.hidden_size;
  options.mlp_hidden_size = args.mlp_hidden_size;
  options.num_attention_heads = args.heads;
  if (args.dropout) options.hidden_dropout = options.attention_dropout = *args.dropout;
  options.intermediate_dropout = args.intermediate_dropout;
  options.mlp_activations = activations_of(args.mlp_activations, layout.tensor_parallel);
  options.sequence_parallel = args.sequence_parallel;
  if (!args.cp_comm_type.empty()) {
    options.cp_comm_type = te::nn::parse_te_name<te::nn::CpCommType>(args.cp_comm_type);
  }
  return options;
}

// Logical axes no rule names stay replicated (Flax's fallback); uneven splits are errors.
void check_even(EncoderClassifier& model) {
  const te::nn::ShardingReport report = te::nn::check_sharding(*model);
  if (report.uneven.empty()) return;
  std::string what;
  for (const auto& u : report.uneven) what += (what.empty() ? "" : "; ") + u;
  throw InputError("the layout splits parameters unevenly: " + what +
                   "; choose sizes the mesh axes divide");
}

// --load: the checkpoint's weights, when it agrees with this run on `config`.
void load_weights(EncoderClassifier& model, const Args& args, const nlohmann::json& config) {
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
}

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& a : items) out += (out.empty() ? "" : ",") + a;
  return out;
}

void print_banner(const Args& args, const Layout& layout, const Sets& sets,
                  const EncoderOptions& options, EncoderClassifier& model, int world_size,
                  int64_t held) {
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  std::cout << "te-encoder: CoLA " << sets.train.size() << " train / " << sets.dev.size()
            << " dev sentences, vocabulary " << sets.vocab.size() << ", max_seq_len "
            << args.max_seq_len << " (" << sets.train.truncated << " train sentences truncated)\n"
            << "  model: Embedding(" << sets.vocab.size() << ", " << args.hidden_size
            << ") -> TransformerLayer(hidden " << args.hidden_size << ", mlp "
            << args.mlp_hidden_size << " " << joined(options.mlp_activations) << ", " << args.heads
            << " heads, dropout " << options.hidden_dropout << "/" << options.attention_dropout
            << "/" << options.intermediate_dropout
            << (args.sequence_parallel ? ", sequence parallel" : "")
            << (args.cp_comm_type.empty() ? "" : ", context parallel " + args.cp_comm_type)
            << ") -> Dense("
            << args.hidden_size << ") x2 -> Dense(2); " << params << " parameters on rank 0\n"
            << "  layout: " << world_size << (world_size == 1 ? " rank, " : " ranks, ")
            << layout.description << ", data-parallel size " << layout.data_parallel << "\n"
            << "  training: " << args.epochs << " epochs, global batch " << args.batch_size
            << ", AdamW lr " << args.lr << " (betas 0.9/0.999, eps 1e-8, weight decay 1e-4), "
            << "seed " << args.seed << ", " << args.dtype << ", fp8 " << args.fp8 << ", "
            << at::get_num_threads() << " threads per rank" << std::endl;
  if (const std::string launch = te::launch_description(); !launch.empty()) {
    std::cout << "  launch: " << launch << std::endl;
  }
  if (args.quantized_weights) {
    std::cout << "  quantized weights: " << held << " GEMM kernels held as E4M3 codes, "
              << te::nn::held_fp8_weight_bytes(*model)
              << " bytes on rank 0 (their fp32 masters in the optimizer)" << std::endl;
  }
}

// The epochs: each a shuffled pass of optimizer steps (or --max-steps of them in all), then the
// dev set. --eval-only evaluates once instead.
class Loop {
 public:
  Loop(const Args& args, const Layout& layout, Trainer& trainer, EncoderClassifier& model,
       torch::optim::AdamW& optimizer, bool lead, StepLog& steps)
      : args_(args),
        layout_(layout),
        trainer_(trainer),
        model_(model),
        optimizer_(optimizer),
        lead_(lead),
        recipe_(recipe_of(args.fp8)),
        steps_(steps) {}

  RunSummary run(const Sets& sets) {
    RunSummary summary;
    const auto start = Clock::now();
    if (args_.eval_only) {
      summary.dev = trainer_.evaluate(sets.dev);
      summary.train_loss = summary.train_accuracy = std::nan("");
      if (lead_) {
        std::cout << "eval: dev_loss " << fmt("%.4f", summary.dev.loss) << " dev_acc "
                  << fmt("%.4f", summary.dev.accuracy) << " dev_mcc "
                  << fmt("%.4f", summary.dev.mcc) << std::endl;
      }
    }
    at::Generator shuffle = at::detail::createCPUGenerator(args_.seed);
    for (int64_t epoch = 1; epoch <= args_.epochs && !stop_ && !args_.eval_only; ++epoch) {
      epoch_of(sets, epoch, shuffle, summary);
    }
    summary.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    summary.samples_per_second = samples_ / summary.seconds;
    return summary;
  }

 private:
  void epoch_of(const Sets& sets, int64_t epoch, at::Generator& shuffle, RunSummary& summary) {
    const auto epoch_start = Clock::now();
    const int64_t steps_per_epoch = sets.train.size() / args_.batch_size;
    const at::Tensor perm = at::randperm(sets.train.size(), shuffle, at::kLong);
    Progress progress(lead_, epoch, args_.epochs, steps_per_epoch);
    double loss_sum = 0, acc_sum = 0;
    int64_t done = 0;
    for (int64_t step = 0; step < steps_per_epoch; ++step) {
      const auto step_start = Clock::now();
      const Batch b =
          batch_of(sets.train, perm.narrow(0, step * args_.batch_size, args_.batch_size),
                   args_.max_seq_len, device_of(args_));
      const auto [l, acc] = step_on(b, summary.steps + 1);
      loss_sum += l;
      acc_sum += acc;
      ++done;
      ++summary.steps;
      samples_ += args_.batch_size;
      const double step_s = std::chrono::duration<double>(Clock::now() - step_start).count();
      steps_.add({summary.steps, epoch, l, acc,
                  fmt("%.1f", step_s > 0 ? args_.batch_size / step_s : 0.0)});
      progress.update(done, {{"loss", loss_sum / done}, {"acc", acc_sum / done}},
                      done * args_.batch_size);
      if (args_.max_steps > 0 && summary.steps >= args_.max_steps) {
        stop_ = true;
        break;
      }
    }
    progress.finish();
    summary.train_loss = loss_sum / std::max<int64_t>(done, 1);
    summary.train_accuracy = acc_sum / std::max<int64_t>(done, 1);
    summary.dev = trainer_.evaluate(sets.dev);
    const double epoch_s = std::chrono::duration<double>(Clock::now() - epoch_start).count();
    if (lead_) {
      std::cout << "epoch " << epoch << ": train_loss " << fmt("%.4f", summary.train_loss)
                << " train_acc " << fmt("%.4f", summary.train_accuracy) << " dev_loss "
                << fmt("%.4f", summary.dev.loss) << " dev_acc " << fmt("%.4f", summary.dev.accuracy)
                << " dev_mcc " << fmt("%.4f", summary.dev.mcc) << " time " << fmt("%.1f", epoch_s)
                << "s" << std::endl;
    }
  }

  // One optimizer step; its loss and accuracy.
  std::pair<double, double> step_on(const Batch& b, int64_t step) {
    at::Tensor loss, out;
    optimizer_.zero_grad();
    {
      std::optional<te::Fp8Autocast> fp8;
      if (recipe_) fp8.emplace(true, *recipe_, layout_.resource);
      out = trainer_.logits(b);
      loss = at::cross_entropy_loss(out, b.labels);
      te::GradientBuckets buckets;
      loss.backward();
      buckets.finish();
    }
    optimizer_.step();
    if (args_.quantized_weights) te::nn::requantize_fp8_weights(*model_);
    const double l = loss.item<double>();
    const double acc = out.detach().argmax(1).eq(b.labels).to(at::kDouble).mean().item<double>();
    if (!std::isfinite(l)) {
      throw std::runtime_error("the training loss became " + std::to_string(l) + " at step " +
                               std::to_string(step));
    }
    return {l, acc};
  }

  const Args& args_;
  const Layout& layout_;
  Trainer& trainer_;
  EncoderClassifier& model_;
  torch::optim::AdamW& optimizer_;
  const bool lead_;
  const std::optional<te::fp8::Recipe> recipe_;
  StepLog& steps_;
  int64_t samples_ = 0;
  bool stop_ = false;
};

nlohmann::json metrics_of(const Args& args, const Layout& layout, const RunSummary& summary,
                          const std::string& activations, int world_size, bool extra) {
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
                      {"rules", args.layout.rules},
                      {"sequence_parallel", args.sequence_parallel},
                      {"cp_comm_type", args.cp_comm_type},
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
  if (extra) {
    j["eval"] = {{"file", args.eval_data},
                 {"loss", summary.extra.loss},
                 {"accuracy", summary.extra.accuracy},
                 {"mcc", summary.extra.mcc}};
  }
  return j;
}

}  // namespace

int train(const Args& args, const Layout& layout, const ColaData& data, int rank, int world_size) {
  const bool lead = rank == 0 && !args.quiet;
  const Sets sets = encode_sets(args, data);

  const te::program::LayoutScope scope(layout);  // mesh and sharding context
  std::optional<te::DeviceMesh> mesh;
  if (scope.mesh() != nullptr) mesh = *scope.mesh();

  const EncoderOptions options = model_options(args, layout, sets.vocab.size());
  te::nn::manual_seed(args.seed);  // the same global weights (and dropout stream) everywhere
  EncoderClassifier model(options);
  if (mesh) check_even(model);
  const std::string activations = joined(options.mlp_activations);
  // What a checkpoint must agree on with this run to be loaded into its model.
  const nlohmann::json config = {{"vocabulary", sets.vocab.words()},
                                 {"max_seq_len", args.max_seq_len},
                                 {"hidden_size", args.hidden_size},
                                 {"mlp_hidden_size", args.mlp_hidden_size},
                                 {"heads", args.heads},
                                 {"mlp_activations", activations}};
  if (!args.load_dir.empty()) {
    load_weights(model, args, config);
    if (lead) std::cout << "loaded " << args.load_dir << std::endl;
  }

  model->to(device_of(args));
  torch::optim::AdamW optimizer(
      model->parameters(),
      torch::optim::AdamWOptions(args.lr).betas({0.9, 0.999}).eps(1e-8).weight_decay(1e-4));
  Trainer trainer(args, model, mesh);
  // Collective (the kernels' amaxes reduced over their ranks); after any --load.
  const int64_t held =
      args.quantized_weights ? te::nn::quantize_fp8_weights(*model, *recipe_of(args.fp8)) : 0;
  if (lead) print_banner(args, layout, sets, options, model, world_size, held);

  StepLog steps(rank == 0 ? args.log_steps : std::string(),
                {"step", "epoch", "loss", "accuracy", "samples_per_second"});
  RunSummary summary = Loop(args, layout, trainer, model, optimizer, lead, steps).run(sets);
  if (sets.extra) {
    summary.extra = trainer.evaluate(*sets.extra);
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
    trainer.calibrate_fp8(sets.train, kCalibrationBatches, layout.resource);
    te::nn::save_checkpoint(*model, args.save_dir, extra.dump());
    if (lead) std::cout << "saved " << args.save_dir << std::endl;
  }
  if (lead) {
    std::cout << "done: " << summary.steps << " steps in " << fmt("%.1f", summary.seconds) << "s, "
              << fmt("%.1f", summary.samples_per_second) << " samples/s" << std::endl;
  }
  steps.finish();
  if (rank == 0 && !args.metrics_json.empty()) {
    te::program::write_json_atomically(
        metrics_of(args, layout, summary, activations, world_size, sets.extra.has_value()),
        args.metrics_json, "--metrics-json");
    if (lead) std::cout << "metrics: " << args.metrics_json << std::endl;
  }
  return 0;
}

}  // namespace encoder
