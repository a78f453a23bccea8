// Loads a Hugging Face causal LM directory with te::hf::load_causal_lm on one process, on TP2
// (vocabulary, heads and MLP sharded over two thread ranks) and on DP2xTP2, runs the ids through
// it, takes the next-token cross-entropy (mean) and its gradients, and writes per layout the
// logits, the loss and every parameter's gradient under the checkpoint's names, whole, for
// tests/interop/check_hf_models.py to hold to transformers. With --logits-only (a real
// pretrained model: tests/interop/check_smollm2.py), no backward: each layout's logits as raw
// float32 in OUT.json.<layout>.f32 and each prompt's greedy next token. --tp N: the tensor-
// parallel size of the TP and DP2xTP layouts (the heads must split evenly).
//
//   te_interop_hf_causal_lm --model DIR|FILE.gguf --ids IDS.json --out OUT.json [--tp N]
//                           [--logits-only]

#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>

#include "cases.h"
#include "te/distributed.h"
#include "te/hf/causal_lm.h"
#include "te/nn/sharded.h"
#include <torch/csrc/autograd/grad_mode.h>

namespace {

using te::interop::as_json;

struct Layout {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> axes;
  te::MeshResource resource;
};

at::Tensor next_token_loss(const at::Tensor& logits, const at::Tensor& ids) {
  const int64_t v = logits.size(-1);
  return at::cross_entropy_loss(logits.narrow(1, 0, ids.size(1) - 1).reshape({-1, v}),
                                ids.narrow(1, 1, ids.size(1) - 1).reshape({-1}));
}

// --logits-only: the logits as raw float32 (little-endian, row-major) in `file`, and each
// prompt's greedy next token (the argmax at its last position).
nlohmann::json logits_only(const at::Tensor& logits, const std::string& file) {
  const at::Tensor l = logits.detach().to(at::kFloat).contiguous();
  std::ofstream(file, std::ios::binary)
      .write(static_cast<const char*>(l.data_ptr()),
             static_cast<std::streamsize>(l.numel() * sizeof(float)));
  const at::Tensor greedy = l.select(1, l.size(1) - 1).argmax(-1);
  return {{"logits_file", file},
          {"shape", l.sizes().vec()},
          {"greedy", std::vector<int64_t>(greedy.data_ptr<int64_t>(),
                                          greedy.data_ptr<int64_t>() + greedy.numel())}};
}

// One layout's logits, loss and gradients (whole, by checkpoint name); rank 0's copy. With
// `logits_file`, only the logits (there) and the greedy next tokens.
nlohmann::json run(const std::string& dir, const at::Tensor& ids, const Layout& l,
                   const std::string& logits_file) {
  nlohmann::json out;
  std::mutex mutex;
  auto body = [&](const te::hf::CausalLM& model, const at::Tensor& logits) -> nlohmann::json {
    if (!logits_file.empty()) return logits_only(logits, logits_file);
    const at::Tensor loss = next_token_loss(logits, ids);
    loss.backward();
    std::map<std::string, at::Tensor> grads;
    const auto layouts = te::nn::named_parameter_layouts(*model);
    for (const auto& p : model->named_parameters()) {
      at::Tensor g = p.value().grad();
      const auto it = layouts.find(p.key());
      if (it != layouts.end() && it->second.mesh) {
        g = te::DTensor::from_local(g, *it->second.mesh, it->second.placements,
                                    it->second.global_shape)
                .full_tensor();
      }
      grads[p.key()] = g;
    }
    nlohmann::json j = {{"logits", as_json(logits)}, {"loss", loss.item<double>()}};
    for (const auto& [name, g] : te::hf::to_hf_tensors(model->config, grads)) {
      j["grads"][name] = as_json(g);
    }
    return j;
  };
  std::optional<torch::NoGradGuard> no_grad;
  if (!logits_file.empty()) no_grad.emplace();
  if (l.shape.empty()) {
    te::hf::CausalLM model = te::hf::load_causal_lm(dir);
    return body(model, model(ids));
  }
  int64_t world = 1;
  for (int64_t s : l.shape) world *= s;
  te::run_local_ranks(static_cast<int>(world), [&](int rank) {
    te::DeviceMesh mesh(l.shape, l.axes);
    te::MeshScope on_mesh(mesh);
    te::MeshResourceScope resource(l.resource);
    te::AxisRulesScope rules(
        te::extend_logical_axis_rules(te::parse_axis_rules("vocab=" + *l.resource.tp)));
    std::optional<torch::NoGradGuard> rank_no_grad;
    if (!logits_file.empty()) rank_no_grad.emplace();
    te::hf::CausalLM model = te::hf::load_causal_lm(dir);
    const te::DTensor logits = model->forward_on_mesh(ids);
    nlohmann::json j = body(model, logits.full_tensor());
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      out = std::move(j);
    }
  });
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, ids_path, out_path;
  int64_t tp_size = 2;
  bool only_logits = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--logits-only") {
      only_logits = true;
    } else if (flag == "--model" && has_value) {
      model = argv[++i];
    } else if (flag == "--ids" && has_value) {
      ids_path = argv[++i];
    } else if (flag == "--out" && has_value) {
      out_path = argv[++i];
    } else if (flag == "--tp" && has_value) {
      tp_size = std::stoll(argv[++i]);
    } else {
      model.clear();
      break;
    }
  }
  if (model.empty() || ids_path.empty() || out_path.empty() || tp_size < 1) {
    std::fprintf(stderr,
                 "usage: te_interop_hf_causal_lm --model DIR|FILE.gguf --ids IDS.json --out "
                 "OUT.json [--tp N (default 2)] [--logits-only]\n");
    return 2;
  }
  try {
    const auto ids_json = nlohmann::json::parse(std::ifstream(ids_path))["ids"];
    std::vector<int64_t> flat;
    for (const auto& row : ids_json) {
      for (const auto& id : row) flat.push_back(id.get<int64_t>());
    }
    const int64_t batch = static_cast<int64_t>(ids_json.size());
    const at::Tensor ids = at::tensor(flat).view({batch, -1});
    te::MeshResource tp, dp_tp;
    tp.tp = "tp";
    dp_tp.dp = "data";
    dp_tp.tp = "tp";
    const std::string n = std::to_string(tp_size);
    const std::vector<Layout> layouts = {
        {"one", {}, {}, {}},
        {"tp" + n, {tp_size}, {"tp"}, tp},
        {"dp2xtp" + n, {2, tp_size}, {"data", "tp"}, dp_tp}};
    nlohmann::json out;
    for (const Layout& l : layouts) {
      out["layouts"][l.name] =
          run(model, ids, l, only_logits ? out_path + "." + l.name + ".f32" : std::string());
    }
    std::ofstream(out_path) << out.dump();
    std::printf("te_interop_hf_causal_lm: %zu layouts of %s written to %s\n", layouts.size(),
                model.c_str(), out_path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "te_interop_hf_causal_lm: %s\n", e.what());
    return 1;
  }
  return 0;
}
