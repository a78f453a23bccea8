// Loads a Hugging Face model with te::hf (a causal LM with load_causal_lm; with --encoder a BERT
// with load_encoder) on one process, on TP2 (vocabulary, heads and MLP sharded over two thread
// ranks) and on DP2xTP2, runs the ids through it, takes a loss and its gradients, and writes per
// layout the outputs, the loss and every parameter's gradient under the checkpoint's names,
// whole, for tests/interop/check_hf_models.py to hold to transformers:
// - causal LM: "logits", the mean next-token cross-entropy;
// - encoder: "logits" = the last hidden states with padded rows zeroed, "pooled" = the pooler's
//   output, and the loss sum(mean_pool(h) * cos(i)) + sum(pooled * sin(i)) (i: the hidden index).
// IDS.json is {"ids": [[...], ...]} and, for an encoder, "attention_mask" and "token_type_ids"
// of the same shape (optional).
// With --logits-only (a real pretrained model: check_smollm2.py, check_minilm.py), no backward:
// each layout's logits (an encoder's normalized mean-pooled sentence embeddings) as raw float32
// in OUT.json.<layout>.f32, and a causal LM's greedy next token of each prompt. --tp N: the
// tensor-parallel size of the TP and DP2xTP layouts (the heads must split evenly). A mixture
// of experts adds the expert-parallel layouts ep2 (experts and batch over one axis: tokens by
// all-to-all), dp2xep2 and ep2xtpN.
// Those layouts load a GGUF file's weights as float32 (LoadOptions::dequantize_gguf); a GGUF
// file adds the layout "one-blocks": loaded as by default on one process, its quantized weights
// held in their blocks, with its logits only ("inference_only") and how many parameters are held
// so ("held_blocks").
//
//   te_interop_hf_model --model DIR|FILE.gguf --ids IDS.json --out OUT.json [--tp N]
//                       [--encoder] [--logits-only]

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include <torch/csrc/autograd/grad_mode.h>
#include "cases.h"
#include "te/distributed.h"
#include "te/hf/causal_lm.h"
#include "te/hf/encoder.h"
#include "te/nn/sharded.h"

namespace {

using te::interop::as_json;

struct Layout {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> axes;
  te::MeshResource resource;
  // A GGUF model as it loads by default on one process: its quantized weights held in their
  // blocks (inference only: logits, no loss or gradients). Otherwise every weight is float32.
  bool blocks = false;
};

// How many parameters of `model` are held in GGUF blocks.
int64_t held_blocks(const torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& m : model.modules(/*include_self=*/true)) {
    if (const auto* s = dynamic_cast<const te::nn::ShardedModule*>(m.get())) {
      n += static_cast<int64_t>(s->all_held_blocks().size());
    }
  }
  return n;
}

at::Tensor next_token_loss(const at::Tensor& logits, const at::Tensor& ids) {
  const int64_t v = logits.size(-1);
  return at::cross_entropy_loss(logits.narrow(1, 0, ids.size(1) - 1).reshape({-1, v}),
                                ids.narrow(1, 1, ids.size(1) - 1).reshape({-1}));
}

// --logits-only: the logits as raw float32 (little-endian, row-major) in `file`, and each
// prompt's greedy next token (the argmax at its last position; none for an encoder).
nlohmann::json logits_only(const at::Tensor& logits, const std::string& file, bool greedy_too) {
  const at::Tensor l = logits.detach().to(at::kFloat).contiguous();
  std::ofstream(file, std::ios::binary)
      .write(static_cast<const char*>(l.data_ptr()),
             static_cast<std::streamsize>(l.numel() * sizeof(float)));
  nlohmann::json j = {{"logits_file", file}, {"shape", l.sizes().vec()}};
  if (greedy_too) {
    const at::Tensor greedy = l.select(1, l.size(1) - 1).argmax(-1);
    j["greedy"] = std::vector<int64_t>(greedy.data_ptr<int64_t>(),
                                       greedy.data_ptr<int64_t>() + greedy.numel());
  }
  return j;
}

// Every parameter's gradient, whole (gathered from the mesh when sharded), by te name.
std::map<std::string, at::Tensor> whole_grads(torch::nn::Module& model) {
  std::map<std::string, at::Tensor> grads;
  const auto layouts = te::nn::named_parameter_layouts(model);
  for (const auto& p : model.named_parameters()) {
    at::Tensor g = p.value().grad();
    const auto it = layouts.find(p.key());
    if (it != layouts.end() && it->second.mesh) {
      g = te::DTensor::from_local(g, *it->second.mesh, it->second.placements,
                                  it->second.global_shape)
              .full_tensor();
    }
    grads[p.key()] = g;
  }
  return grads;
}

// What one layout of one model gives: the primary output (logits, or hidden states), the
// pooler's output (encoder), the loss, and the weight map naming the gradients.
struct Outputs {
  at::Tensor logits, pooled, loss;
  te::hf::WeightMap map;
};

// A causal LM's logits and next-token loss (with the router's load-balancing term where the
// config counts it, as transformers' loss does).
Outputs causal_lm(te::hf::CausalLM& model, const at::Tensor& ids, bool on_mesh) {
  Outputs o;
  te::nn::RouterLoadScope loads;
  o.logits = on_mesh ? model->forward_on_mesh(ids).full_tensor() : model->forward(ids);
  o.loss = next_token_loss(o.logits, ids) + te::hf::router_aux_loss(model->config, loads.loads());
  o.map = te::hf::causal_lm_weight_map(model->config);
  return o;
}

// An encoder's hidden states (padded rows zeroed), its pooler's output, or with `embeddings`
// the normalized mean-pooled sentence embeddings as the primary output.
Outputs encoder(te::hf::Encoder& model, const at::Tensor& ids, const at::Tensor& mask,
                const at::Tensor& types, bool on_mesh, bool embeddings) {
  Outputs o;
  at::Tensor hidden, pooled;
  if (!on_mesh) {
    hidden = model->forward(ids, mask, types);
    if (model->pooler && !embeddings) pooled = model->pool(hidden);
  } else {
    const te::DTensor h = model->forward_on_mesh(ids, mask, types);
    hidden = h.full_tensor();
    if (model->pooler && !embeddings) pooled = model->pool(h).full_tensor();
  }
  const at::Tensor mean = te::hf::mean_pool(hidden, mask);
  if (embeddings) {
    o.logits = te::hf::l2_normalize(mean);
    return o;
  }
  const int64_t n = hidden.size(-1);
  o.logits = hidden * mask.unsqueeze(-1).to(hidden.scalar_type());
  o.loss = (mean * at::arange(n, hidden.options()).cos()).sum();
  if (pooled.defined()) {
    o.pooled = pooled;
    o.loss = o.loss + (pooled * at::arange(n, hidden.options()).sin()).sum();
  }
  o.map = te::hf::encoder_weight_map(model->config);  // BertModel's names
  return o;
}

// One layout's outputs, loss and gradients (whole, by checkpoint name); rank 0's copy. With
// `logits_file`, only the logits (there) and the greedy next tokens.
nlohmann::json run(const std::string& dir, bool is_encoder, const at::Tensor& ids,
                   const at::Tensor& mask, const at::Tensor& types, const Layout& l,
                   const std::string& logits_file) {
  const bool only_logits = !logits_file.empty() || l.blocks;
  std::optional<torch::NoGradGuard> no_grad;
  if (only_logits) no_grad.emplace();
  // Loads the model (under the mesh and rules in scope) and runs `ids` (a tensor or a DTensor).
  auto body = [&](bool on_mesh) -> nlohmann::json {
    std::optional<torch::NoGradGuard> rank_no_grad;  // grad mode is per thread
    if (only_logits) rank_no_grad.emplace();
    std::shared_ptr<torch::nn::Module> model;
    Outputs o;
    if (is_encoder) {
      te::hf::Encoder m = te::hf::load_encoder(dir);
      o = encoder(m, ids, mask, types, on_mesh, only_logits);
      model = m.ptr();
    } else {
      te::hf::LoadOptions options;
      options.dequantize_gguf = !l.blocks;
      te::hf::CausalLM m = te::hf::load_causal_lm(dir, options);
      o = causal_lm(m, ids, on_mesh);
      model = m.ptr();
    }
    if (l.blocks) {
      nlohmann::json j = logits_file.empty() ? nlohmann::json{{"logits", as_json(o.logits)}}
                                             : logits_only(o.logits, logits_file, true);
      j["inference_only"] = true;
      j["held_blocks"] = held_blocks(*model);
      return j;
    }
    if (only_logits) return logits_only(o.logits, logits_file, !is_encoder);
    o.loss.backward();
    nlohmann::json j = {{"logits", as_json(o.logits)}, {"loss", o.loss.item<double>()}};
    if (o.pooled.defined()) j["pooled"] = as_json(o.pooled);
    for (const auto& [name, g] : te::hf::to_hf_tensors(o.map, whole_grads(*model))) {
      j["grads"][name] = as_json(g);
    }
    return j;
  };
  if (l.shape.empty()) return body(false);
  nlohmann::json out;
  std::mutex mutex;
  int64_t world = 1;
  for (int64_t s : l.shape) world *= s;
  te::run_local_ranks(static_cast<int>(world), [&](int rank) {
    te::DeviceMesh mesh(l.shape, l.axes);
    te::MeshScope on_mesh(mesh);
    te::MeshResourceScope resource(l.resource);
    // The vocabulary over the tensor-parallel axis, where the layout has one.
    te::AxisRulesScope rules(te::extend_logical_axis_rules(
        te::parse_axis_rules(l.resource.tp ? "vocab=" + *l.resource.tp : std::string())));
    nlohmann::json j = body(true);
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(mutex);
      out = std::move(j);
    }
  });
  return out;
}

// A [rows, cols] int64 tensor from a JSON list of equal-length lists (`what` names it).
at::Tensor rows_of(const nlohmann::json& rows, const char* what) {
  if (!rows.is_array() || rows.empty() || !rows[0].is_array() || rows[0].empty()) {
    throw std::runtime_error(std::string(what) + " must be a non-empty list of lists");
  }
  std::vector<int64_t> flat;
  for (const auto& row : rows) {
    if (!row.is_array() || row.size() != rows[0].size()) {
      throw std::runtime_error(std::string(what) + ": rows of different lengths");
    }
    for (const auto& v : row) flat.push_back(v.get<int64_t>());
  }
  return at::tensor(flat).view({static_cast<int64_t>(rows.size()), -1});
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, ids_path, out_path;
  int64_t tp_size = 2;
  bool only_logits = false, is_encoder = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--logits-only") {
      only_logits = true;
    } else if (flag == "--encoder") {
      is_encoder = true;
    } else if (flag == "--model" && has_value) {
      model = argv[++i];
    } else if (flag == "--ids" && has_value) {
      ids_path = argv[++i];
    } else if (flag == "--out" && has_value) {
      out_path = argv[++i];
    } else if (flag == "--tp" && has_value) {
      char* end = nullptr;
      tp_size = std::strtoll(argv[++i], &end, 10);
      if (*end != '\0') tp_size = 0;
    } else {
      model.clear();
      break;
    }
  }
  if (model.empty() || ids_path.empty() || out_path.empty() || tp_size < 1) {
    std::fprintf(stderr,
                 "usage: te_interop_hf_model --model DIR|FILE.gguf --ids IDS.json --out OUT.json "
                 "[--tp N (default 2)] [--encoder] [--logits-only]\n");
    return 2;
  }
  try {
    const auto input = nlohmann::json::parse(std::ifstream(ids_path));
    const at::Tensor ids = rows_of(input.at("ids"), "ids");
    at::Tensor mask = at::ones_like(ids);
    if (input.contains("attention_mask")) mask = rows_of(input["attention_mask"], "attention_mask");
    at::Tensor types;
    if (input.contains("token_type_ids"))
      types = rows_of(input["token_type_ids"], "token_type_ids");
    if (!mask.sizes().equals(ids.sizes()) ||
        (types.defined() && !types.sizes().equals(ids.sizes()))) {
      throw std::runtime_error("attention_mask or token_type_ids has not the ids' shape");
    }
    te::MeshResource tp, dp_tp;
    tp.tp = "tp";
    dp_tp.dp = "data";
    dp_tp.tp = "tp";
    const std::string n = std::to_string(tp_size);
    std::vector<Layout> layouts = {{"one", {}, {}, {}},
                                   {"tp" + n, {tp_size}, {"tp"}, tp},
                                   {"dp2xtp" + n, {2, tp_size}, {"data", "tp"}, dp_tp}};
    char magic[4] = {};
    const bool gguf = !is_encoder && std::ifstream(model, std::ios::binary).read(magic, 4) &&
                      std::string(magic, 4) == "GGUF";
    if (gguf) layouts.push_back({"one-blocks", {}, {}, {}, /*blocks=*/true});
    if (!is_encoder && !gguf && te::hf::read_causal_lm_config(model).num_experts > 0) {
      // A mixture of experts: expert parallel by all-to-all over the data axis (ep2), on whole
      // tokens beside data parallelism (dp2xep2), and with tensor parallelism in each expert.
      te::MeshResource ep, dp_ep, ep_tp;
      ep.dp = ep.ep = "data";
      dp_ep.dp = "data";
      dp_ep.ep = "expert";
      ep_tp.dp = ep_tp.ep = "data";
      ep_tp.tp = "tp";
      layouts.push_back({"ep2", {2}, {"data"}, ep});
      layouts.push_back({"dp2xep2", {2, 2}, {"data", "expert"}, dp_ep});
      layouts.push_back({"ep2xtp" + n, {2, tp_size}, {"data", "tp"}, ep_tp});
    }
    nlohmann::json out;
    for (const Layout& l : layouts) {
      out["layouts"][l.name] = run(model, is_encoder, ids, mask, types, l,
                                   only_logits ? out_path + "." + l.name + ".f32" : std::string());
    }
    std::ofstream(out_path) << out.dump();
    std::printf("te_interop_hf_model: %zu layouts of %s written to %s\n", layouts.size(),
                model.c_str(), out_path.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "te_interop_hf_model: %s\n", e.what());
    return 1;
  }
  return 0;
}
