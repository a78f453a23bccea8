// Loads a Hugging Face causal LM directory with te::hf::load_causal_lm on one process, on TP2
// (vocabulary, heads and MLP sharded over two thread ranks) and on DP2xTP2, runs the ids through
// it, takes the next-token cross-entropy (mean) and its gradients, and writes per layout the
// logits, the loss and every parameter's gradient under the checkpoint's names, whole, for
// tests/interop/check_hf_models.py to hold to transformers.
//
//   te_interop_hf_causal_lm --model DIR --ids IDS.json --out OUT.json

#include <ATen/ATen.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "cases.h"
#include "te/distributed.h"
#include "te/hf/causal_lm.h"
#include "te/nn/sharded.h"

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

// One layout's logits, loss and gradients (whole, by checkpoint name); rank 0's copy.
nlohmann::json run(const std::string& dir, const at::Tensor& ids, const Layout& l) {
  nlohmann::json out;
  std::mutex mutex;
  auto body = [&](const te::hf::CausalLM& model, const at::Tensor& logits) {
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
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") model = argv[i + 1];
    if (flag == "--ids") ids_path = argv[i + 1];
    if (flag == "--out") out_path = argv[i + 1];
  }
  if (model.empty() || ids_path.empty() || out_path.empty()) {
    std::fprintf(stderr, "usage: te_interop_hf_causal_lm --model DIR --ids IDS.json --out OUT.json\n");
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
    const std::vector<Layout> layouts = {
        {"one", {}, {}, {}},
        {"tp2", {2}, {"tp"}, tp},
        {"dp2xtp2", {2, 2}, {"data", "tp"}, dp_tp}};
    nlohmann::json out;
    for (const Layout& l : layouts) out["layouts"][l.name] = run(model, ids, l);
    std::ofstream(out_path) << out.dump();
    std::printf("te_interop_hf_causal_lm: %zu layouts of %s written to %s\n", layouts.size(),
                model.c_str(), out_path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "te_interop_hf_causal_lm: %s\n", e.what());
    return 1;
  }
  return 0;
}
