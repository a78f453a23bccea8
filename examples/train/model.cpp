// te-train's model (see model.h).

#include "model.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "te/error.h"
#include "te/hf/chat.h"
#include "te/hf/config.h"
#include "te/hf/save.h"
#include "te/input_error.h"
#include "te/nn/init.h"
#include "te/program/report.h"

namespace train {

namespace {

namespace fs = std::filesystem;

std::string read_text(const std::string& path, const char* option) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw te::InputError(std::string(option) + ": cannot read '" + path + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// eos_token_id of a config.json (a number or a list: its first).
int64_t config_eos(const std::string& config_text) {
  const nlohmann::json j = nlohmann::json::parse(config_text, nullptr, false);
  if (!j.is_object() || !j.contains("eos_token_id")) return -1;
  const nlohmann::json& e = j["eos_token_id"];
  if (e.is_number_integer()) return e.get<int64_t>();
  if (e.is_array() && !e.empty() && e[0].is_number_integer()) return e[0].get<int64_t>();
  return -1;
}

// The model's generation files (eos, chat template) where it has them.
void read_defaults(const std::string& dir_or_gguf, OpenedModel& m) {
  const te::hf::GenerationDefaults d = te::hf::read_generation_defaults(dir_or_gguf);
  if (!d.eos_token_ids.empty()) m.eos_id = d.eos_token_ids.front();
  if (d.chat_template.empty()) return;
  try {
    m.chat_template = te::gen::ChatTemplate::recognise(d.chat_template, dir_or_gguf);
  } catch (const te::Error&) {
    // A template te-cpp does not know: chat data is refused by name when it needs one.
  }
}

}  // namespace

OpenedModel open_model(const Args& a) {
  OpenedModel m;
  if (!a.model.empty()) {
    te::hf::LoadOptions load;
    load.dequantize_gguf = true;  // trainable float32 weights
    load.packed_sequences = a.pack;
    if (!a.cp_comm_type.empty()) {
      load.cp_comm_type = te::nn::parse_te_name<te::nn::CpCommType>(a.cp_comm_type);
      // TE's order (LmTrainer orders each batch so), where it keeps the run one process's
      load.cp_load_balanced = true;
    }
    m.model = te::hf::load_causal_lm(a.model, load);
    const bool dir = fs::is_directory(a.model);
    m.tokenizer =
        dir ? te::hf::Tokenizer::from_pretrained(a.model) : te::hf::Tokenizer::from_file(a.model);
    if (dir) m.config = read_text((fs::path(a.model) / "config.json").string(), "--model");
    read_defaults(a.model, m);
  } else {
    m.config = read_text(a.config, "--config");
    te::hf::CausalLMConfig config = te::hf::parse_causal_lm_config(m.config, a.config);
    config.packed_sequences = a.pack;
    if (!a.cp_comm_type.empty()) {
      config.cp_comm_type = te::nn::parse_te_name<te::nn::CpCommType>(a.cp_comm_type);
      config.cp_load_balanced = te::hf::cp_load_balance_is_exact(config);
    }
    te::nn::manual_seed(a.seed);  // the same weights on every rank and every run
    m.model = te::hf::CausalLM(config);
    m.tokenizer = fs::is_directory(a.tokenizer) ? te::hf::Tokenizer::from_pretrained(a.tokenizer)
                                                : te::hf::Tokenizer::from_file(a.tokenizer);
    if (fs::is_directory(a.tokenizer)) read_defaults(a.tokenizer, m);
    if (m.eos_id < 0) m.eos_id = config_eos(m.config);
  }
  if (a.pack && !a.cp_comm_type.empty() && !te::hf::cp_load_balance_is_exact(m.model->config)) {
    throw te::InputError(
        "--pack with --cp-comm-type: the model has dropout outside attention (on the embeddings "
        "or the residuals), whose masks follow the tokens' places, and packed rows under "
        "context parallelism are in TE's thd order, not the sequence's; set those dropouts to 0 "
        "in its config, or drop --pack (whole rows keep contiguous chunks then)");
  }
  if (a.router_aux_loss) {
    te::hf::CausalLMConfig& c = m.model->config;  // read by each step's loss
    if (c.num_experts == 0) {
      throw te::InputError(
          "--router-aux-loss: the model has no mixture-of-experts layer (num_experts), so no "
          "router to balance; drop the option");
    }
    c.output_router_logits = *a.router_aux_loss > 0;
    c.router_aux_loss_coef = *a.router_aux_loss;
  }
  if (m.eos_id < 0) {
    throw te::InputError(
        "the model names no EOS token (eos_token_id in config.json or "
        "generation_config.json), which ends each document of the data");
  }
  TE_CHECK(m.tokenizer->vocab_size() <= m.model->config.vocab_size, "te-train: the tokenizer has ",
           m.tokenizer->vocab_size(), " tokens but the model's vocabulary ",
           m.model->config.vocab_size, "; give the model's own tokenizer");
  return m;
}

void print_banner(const Args& a, const OpenedModel& m, const te::train::Data& data, int world_size,
                  int64_t micro_batches) {
  int64_t params = 0;
  for (const auto& p : m.model->parameters()) params += p.numel();
  std::cout << "te-train: " << (a.model.empty() ? a.config + " (random weights)" : a.model) << ", "
            << params << " parameters on this rank, " << a.dtype
            << (a.fp8 == "none" ? "" : ", fp8 " + a.fp8) << ", " << world_size
            << (world_size == 1 ? " rank" : " ranks") << "\n  data: " << a.data << " ("
            << data.train.num_units() << (a.pack ? " packed rows of " : " blocks of ") << a.seq_len
            << " tokens, " << data.train.steps_per_epoch() << " batches an epoch)"
            << (data.eval ? ", eval " + std::to_string(data.eval->num_units()) +
                                (a.pack ? " rows" : " blocks")
                          : "")
            << "\n  steps " << a.steps << ", " << micro_batches << " x " << a.micro_batch
            << " rows a step, lr " << te::program::fmt("%.3g", a.lr) << " (" << a.schedule
            << ", warmup " << a.warmup << "), clip " << a.clip << std::endl;
}

void export_gguf(const Args& a, const te::hf::CausalLMImpl& model) {
  te::hf::save_gguf(model, a.model, a.export_gguf, a.export_gguf_type);
}

void export_hf(const Args& a, const OpenedModel& m, const te::hf::CausalLMImpl& model) {
  te::hf::save_causal_lm(model, a.export_hf, m.config);
  if (te::world_rank() != 0) return;
  const std::string source = a.model.empty() ? a.tokenizer : a.model;
  if (!fs::is_directory(source)) {  // --tokenizer FILE: a tokenizer.json goes in as one
    if (fs::path(source).extension() == ".json") {
      fs::copy_file(source, fs::path(a.export_hf) / "tokenizer.json",
                    fs::copy_options::overwrite_existing);
    }
    return;
  }
  for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "generation_config.json", "vocab.txt", "merges.txt", "vocab.json"}) {
    const fs::path from = fs::path(source) / name;
    if (fs::exists(from)) {
      fs::copy_file(from, fs::path(a.export_hf) / name, fs::copy_options::overwrite_existing);
    }
  }
}

}  // namespace train
