// Trains a Hugging Face causal LM loaded with te::hf for a few steps with te's training step,
// te::train::LmTrainer (te::optim::AdamW with its weight-decay groups, te::optim::LrSchedule,
// te::optim::clip_grad_norm, gradient accumulation with one reduction, the loss the mean over
// label tokens, some labels -100), on several layouts, and writes each step's loss and gradient
// norm per run (and, where a run says "export", the trained model as Hugging Face files by
// te::hf::save_causal_lm), for tests/interop/check_train_steps.py to hold to transformers +
// torch.optim.AdamW + LambdaLR + clip_grad_norm_ doing the same.
//
// RUN.json: {"batches": [[[ids of a row] x global batch] x steps], "lr": float, "betas": [b1, b2],
// "eps": float, "weight_decay": float, "warmup": int, "decay_type": "linear"|"sqrt"|"cosine",
// "lr_min": float, "clip": float, "runs": [{"name": str, "mesh": [sizes], "axes": [names],
// "mesh_resource": "dp=data,tp=tp", "micro_batches": int, "dtype": "float32"|"bfloat16",
// "zero": mesh axis (ZeRO-1),
// "export": DIR}]}.
// OUT.json: {"runs": {name: {"loss": [...], "grad_norm": [...]}}}.
//
//   te_interop_train --model DIR --run RUN.json --out OUT.json

#include <ATen/ATen.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "te/distributed.h"
#include "te/hf/causal_lm.h"
#include "te/hf/save.h"
#include "te/train/lm_trainer.h"

namespace {

struct Run {
  std::string name;
  std::vector<int64_t> mesh;
  std::vector<std::string> axes;
  std::string mesh_resource;
  int64_t micro_batches = 1;
  at::ScalarType dtype = at::kFloat;
  std::string export_dir;  // the trained model saved here as Hugging Face files
  std::string zero_axis;   // ZeRO-1 over this mesh axis
};

// A step's rows as the trainer's batches: ids the first SEQ - 1 tokens, labels the next ones,
// -100 where (3 row + position^2) mod 7 is 0 (a different count in each row).
te::train::Batch batch_of(const at::Tensor& rows, int64_t first_row) {
  te::train::Batch b;
  const int64_t seq = rows.size(1) - 1;
  b.ids = rows.narrow(1, 0, seq).contiguous();
  b.labels = rows.narrow(1, 1, seq).clone();
  const at::Tensor row = at::arange(first_row, first_row + rows.size(0)).unsqueeze(1);
  const at::Tensor pos = at::arange(seq).unsqueeze(0);
  b.labels.masked_fill_((row * 3 + pos * pos).remainder(7) == 0, -100);
  b.position_ids = pos.expand({rows.size(0), seq}).contiguous();
  b.label_tokens = b.labels.ne(-100).sum().item<int64_t>();
  return b;
}

// One run on this rank (inside its mesh scope when it has a mesh): every step's loss and norm;
// with `export_dir`, the trained model saved there as Hugging Face files.
nlohmann::json train(const std::string& dir, const nlohmann::json& spec,
                     const std::vector<at::Tensor>& batches, const Run& run,
                     const std::string& export_dir) {
  te::hf::CausalLM model = te::hf::load_causal_lm(dir);
  model->to(run.dtype);
  const auto betas = spec.at("betas").get<std::vector<double>>();
  te::train::TrainerOptions options;
  options.adamw = te::optim::AdamWOptions(spec.at("lr").get<double>())
                      .betas({betas.at(0), betas.at(1)})
                      .eps(spec.at("eps").get<double>())
                      .weight_decay(spec.at("weight_decay").get<double>());
  const int64_t steps = static_cast<int64_t>(batches.size());
  options.schedule = te::optim::LrScheduleOptions(steps)
                         .warmup_steps(spec.at("warmup").get<int64_t>())
                         .decay_type(spec.at("decay_type").get<std::string>())
                         .lr_min(spec.at("lr_min").get<double>());
  options.clip = spec.at("clip").get<double>();
  options.zero_axis = run.zero_axis;
  te::train::LmTrainer trainer(model, options);
  nlohmann::json out = {{"loss", nlohmann::json::array()}, {"grad_norm", nlohmann::json::array()}};
  for (int64_t step = 0; step < steps; ++step) {
    const at::Tensor& rows = batches[static_cast<std::size_t>(step)];
    const int64_t micro = rows.size(0) / run.micro_batches;
    std::vector<te::train::Batch> micro_batches;
    for (int64_t m = 0; m < run.micro_batches; ++m) {
      micro_batches.push_back(batch_of(rows.narrow(0, m * micro, micro), m * micro));
    }
    const te::train::StepStats s = trainer.step(micro_batches, step);
    out["loss"].push_back(s.loss);
    out["grad_norm"].push_back(s.grad_norm);
  }
  if (!export_dir.empty()) {
    std::ifstream in(dir + "/config.json");
    const std::string config((std::istreambuf_iterator<char>(in)), {});
    te::hf::save_causal_lm(*model, export_dir, config);
  }
  return out;
}

nlohmann::json run_on_ranks(const std::string& dir, const nlohmann::json& spec,
                            const std::vector<at::Tensor>& batches, const Run& run) {
  if (run.mesh.empty()) return train(dir, spec, batches, run, run.export_dir);
  nlohmann::json out;
  std::mutex mutex;
  int64_t world = 1;
  for (int64_t s : run.mesh) world *= s;
  const te::MeshResource resource = te::parse_mesh_resource(run.mesh_resource);
  te::run_local_ranks(static_cast<int>(world), [&](int rank) {
    te::DeviceMesh mesh(run.mesh, run.axes);
    te::MeshScope on_mesh(mesh);
    te::MeshResourceScope roles(resource);
    std::optional<te::AxisRulesScope> rules;
    if (resource.tp) {
      rules.emplace(te::extend_logical_axis_rules(te::parse_axis_rules("vocab=" + *resource.tp)));
    }
    nlohmann::json j = train(dir, spec, batches, run, run.export_dir);
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      out = std::move(j);
    }
  });
  return out;
}

Run run_of(const nlohmann::json& j) {
  Run r;
  r.name = j.at("name").get<std::string>();
  r.mesh = j.value("mesh", std::vector<int64_t>{});
  r.axes = j.value("axes", std::vector<std::string>{});
  r.mesh_resource = j.value("mesh_resource", std::string());
  r.micro_batches = j.value("micro_batches", int64_t{1});
  r.export_dir = j.value("export", std::string());
  r.zero_axis = j.value("zero", std::string());
  const std::string dtype = j.value("dtype", std::string("float32"));
  if (dtype == "bfloat16") {
    r.dtype = at::kBFloat16;
  } else if (dtype != "float32") {
    throw std::runtime_error("run " + r.name + ": dtype " + dtype + " is not float32 or bfloat16");
  }
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, run_path, out_path;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") model = argv[i + 1];
    if (flag == "--run") run_path = argv[i + 1];
    if (flag == "--out") out_path = argv[i + 1];
  }
  if (model.empty() || run_path.empty() || out_path.empty()) {
    std::fprintf(stderr, "usage: te_interop_train --model DIR --run RUN.json --out OUT.json\n");
    return 2;
  }
  try {
    const auto spec = nlohmann::json::parse(std::ifstream(run_path));
    std::vector<at::Tensor> batches;
    for (const auto& step : spec.at("batches")) {
      std::vector<int64_t> flat;
      for (const auto& row : step) {
        for (const auto& id : row) flat.push_back(id.get<int64_t>());
      }
      batches.push_back(at::tensor(flat).view({static_cast<int64_t>(step.size()), -1}));
    }
    nlohmann::json out;
    for (const auto& r : spec.at("runs")) {
      const Run run = run_of(r);
      out["runs"][run.name] = run_on_ranks(model, spec, batches, run);
    }
    std::ofstream(out_path) << out.dump();
    std::printf("te_interop_train: %zu runs of %s written to %s\n", spec.at("runs").size(),
                model.c_str(), out_path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "te_interop_train: %s\n", e.what());
    return 1;
  }
  return 0;
}
