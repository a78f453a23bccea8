#include "te/hf/config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

#include "json_fields.h"
#include "te/error.h"

namespace te::hf {

namespace {

using detail::Fields;
using detail::kMetadata;
using nlohmann::json;

// A value given in two places must be given once or the same in both.
template <typename T>
void settle(std::optional<T>& have, const std::optional<T>& also, const std::string& what,
            const Fields& f) {
  if (!also) return;
  if (have && !(*have == *also)) {
    f.fail(what, "is given twice with different values; give it once");
  }
  have = also;
}

// RoPE: transformers 5's rope_parameters, or the older rope_theta and rope_scaling (where
// transformers 4 saved both "type" and "rope_type"). A value may appear at the top level and
// inside the object only if both agree.
void read_rope(Fields& f, const std::string& path, CausalLMConfig& c, double& partial) {
  std::optional<double> theta, factor, part;
  std::optional<std::string> type;
  if (f.has("rope_theta")) theta = f.number_or("rope_theta", 0);
  if (f.has("partial_rotary_factor")) part = f.number_or("partial_rotary_factor", 0);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!f.has(key)) continue;
    const json& r = f.raw(key);
    if (!r.is_object()) f.fail(key, "expected an object, got " + r.dump());
    Fields rope(r, path, std::string(key) + ".");
    for (const char* name : {"rope_type", "type"}) {
      if (rope.has(name))
        settle(type, std::optional<std::string>(rope.string_or(name, "")),
               std::string(key) + "." + name, rope);
    }
    if (rope.has("rope_theta")) {
      settle(theta, std::optional<double>(rope.number_or("rope_theta", 0)), "rope_theta", rope);
    }
    if (rope.has("partial_rotary_factor")) {
      settle(part, std::optional<double>(rope.number_or("partial_rotary_factor", 0)),
             "partial_rotary_factor", rope);
    }
    if (rope.has("factor")) {
      settle(factor, std::optional<double>(rope.number_or("factor", 0)), "factor", rope);
    }
    rope.refuse_unread({});
  }
  c.rope_type = type.value_or("default");
  if (c.rope_type == "linear") {
    if (!factor) f.fail("rope_parameters", "linear RoPE scaling needs a factor");
    c.rope_factor = *factor;
  } else if (c.rope_type != "default") {
    f.fail("rope_parameters.rope_type", "'" + c.rope_type +
                                            "' RoPE scaling is not supported by te-cpp (it "
                                            "supports 'default' and 'linear')");
  } else if (factor) {
    f.fail("rope_parameters.factor", "is given for RoPE type 'default', which takes none");
  }
  c.rope_theta = theta.value_or(10000.0);
  partial = part.value_or(1.0);
}

// Sliding windows as each family's transformers config has them: Mistral's sliding_window on
// every layer (4096 when absent, none when null); Qwen's only with use_sliding_window, on the
// layers layer_types names (or, without it, from max_window_layers on: 28 when absent); Llama
// has none (a window there is refused).
void read_windows(Fields& f, const json& j, CausalLMConfig& c) {
  c.layer_windows.assign(static_cast<std::size_t>(c.num_hidden_layers), std::nullopt);
  if (c.model_type == "llama") return;  // sliding_window, layer_types: unread, so refused
  std::optional<int64_t> window;
  const bool absent = !j.contains("sliding_window");
  if (f.has("sliding_window")) window = f.integer("sliding_window");
  if (absent) window = 4096;  // transformers' default for Mistral, Qwen2 and Qwen3
  if (c.model_type == "mistral") {
    for (auto& w : c.layer_windows) w = window;
    return;
  }
  if (!f.boolean_or("use_sliding_window", false)) window.reset();
  const int64_t first = f.integer_or("max_window_layers", 28);  // (superseded by layer_types)
  if (f.has("layer_types")) {
    const json& types = f.raw("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c.num_hidden_layers) {
      f.fail("layer_types", "expected a list of num_hidden_layers entries, got " + types.dump());
    }
    for (std::size_t i = 0; i < types.size(); ++i) {
      if (types[i] == "sliding_attention") {
        if (!window) f.fail("layer_types", "names a sliding_attention layer but no window is on");
        c.layer_windows[i] = window;
      } else if (types[i] != "full_attention") {
        f.fail("layer_types",
               "entry " + types[i].dump() + " is not full_attention or sliding_attention");
      }
    }
  } else if (window) {
    for (int64_t i = std::max<int64_t>(first, 0); i < c.num_hidden_layers; ++i) {
      c.layer_windows[static_cast<std::size_t>(i)] = window;
    }
  }
}

// model_type and architectures: which family, and that the file is its causal LM.
void read_family(Fields& f, CausalLMConfig& c) {
  static const std::vector<std::pair<std::string, std::string>> kFamilies = {
      {"llama", "LlamaForCausalLM"},
      {"mistral", "MistralForCausalLM"},
      {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"},
      {"gpt2", "GPT2LMHeadModel"}};
  c.model_type = f.string_or("model_type", "");
  const auto family = std::find_if(kFamilies.begin(), kFamilies.end(),
                                   [&](const auto& p) { return p.first == c.model_type; });
  if (family == kFamilies.end()) {
    f.fail("model_type", "'" + c.model_type +
                             "' is not a causal LM family te-cpp loads (llama, mistral, qwen2, "
                             "qwen3, gpt2; a bert encoder loads with te::hf::load_encoder)");
  }
  if (!f.has("architectures")) return;
  const json& a = f.raw("architectures");
  if (!a.is_array()) f.fail("architectures", "expected a list, got " + a.dump());
  for (const json& name : a) {
    if (name != family->second) {
      f.fail("architectures", "entry " + name.dump() +
                                  " is not one te-cpp builds for model_type '" + c.model_type +
                                  "' (" + family->second + ")");
    }
  }
}

// GPT-2's config (transformers' GPT2Config names and defaults): learned positions, pre-LayerNorm,
// biases on every projection, a fused c_attn, the MLP's one activation, a tied head.
void read_gpt2(Fields& f, CausalLMConfig& c) {
  c.vocab_size = f.integer_or("vocab_size", 50257);
  c.max_position_embeddings = f.integer_or("n_positions", 1024);
  if (f.has("n_ctx") && f.integer("n_ctx") != c.max_position_embeddings) {
    f.fail("n_ctx", "differs from n_positions; te-cpp takes one context length");
  }
  c.hidden_size = f.integer_or("n_embd", 768);
  c.num_hidden_layers = f.integer_or("n_layer", 12);
  c.num_attention_heads = f.integer_or("n_head", 12);
  c.num_key_value_heads = c.num_attention_heads;
  if (c.num_attention_heads <= 0 || c.hidden_size % c.num_attention_heads != 0) {
    f.fail("n_head", std::to_string(c.num_attention_heads) + " does not divide n_embd " +
                         std::to_string(c.hidden_size));
  }
  // Bounded before anything is sized or multiplied by them.
  detail::check_model_sizes({{"vocab_size", c.vocab_size},
                             {"n_embd", c.hidden_size},
                             {"n_layer", c.num_hidden_layers},
                             {"n_head", c.num_attention_heads},
                             {"n_positions", c.max_position_embeddings}},
                            c.num_hidden_layers, f.path());
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.intermediate_size = f.has("n_inner") ? f.integer("n_inner") : 4 * c.hidden_size;
  // transformers' ACT2FN: gelu_new and gelu_pytorch_tanh are the tanh form, gelu the erf form.
  const std::string act = f.string_or("activation_function", "gelu_new");
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
    c.mlp_activations = {"gelu"};
  } else if (act == "gelu") {
    c.mlp_activations = {"gelu_exact"};
  } else if (act == "relu" || act == "silu") {
    c.mlp_activations = {act};
  } else {
    f.fail("activation_function", "'" + act +
                                      "' is not one te-cpp builds (gelu_new, gelu_pytorch_tanh, "
                                      "gelu, relu, silu)");
  }
  c.hidden_dropout = f.number_or("resid_pdrop", 0.1);
  c.embedding_dropout = f.number_or("embd_pdrop", 0.1);
  c.attention_dropout = f.number_or("attn_pdrop", 0.1);
  c.rms_norm_eps = f.number_or("layer_norm_epsilon", 1e-5);
  if (!f.boolean_or("scale_attn_weights", true)) {
    f.fail("scale_attn_weights", "false: te-cpp scales the logits by 1/sqrt(head_dim)");
  }
  if (f.boolean_or("scale_attn_by_inverse_layer_idx", false)) {
    f.fail("scale_attn_by_inverse_layer_idx", "true is not implemented");
  }
  // Upcasting the logits to fp32 changes nothing in fp32, which te computes them in.
  f.boolean_or("reorder_and_upcast_attn", false);
  if (f.boolean_or("add_cross_attention", false)) {
    f.fail("add_cross_attention", "true adds cross attention; te-cpp builds the decoder alone");
  }
  // pad_token_id stays metadata: GPT-2's wte has no padding_idx (modeling_gpt2.py), its row trains.
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", true);
  c.positions = "learned";
  c.norm = "layernorm";
  c.fuse_qkv = true;
  c.attention_bias = c.qkv_bias = c.mlp_bias = true;
  c.rotary_dim = c.head_dim;
  c.layer_windows.assign(static_cast<std::size_t>(std::max<int64_t>(c.num_hidden_layers, 0)),
                         std::nullopt);
}

}  // namespace

void check_causal_lm_config(const CausalLMConfig& c, const std::string& where) {
  auto fail = [&](const std::string& field, const std::string& message) {
    TE_FAIL("config: ", where, ": ", field, ": ", message);
  };
  detail::check_model_sizes({{"vocab_size", c.vocab_size},
                             {"hidden_size", c.hidden_size},
                             {"intermediate_size", c.intermediate_size},
                             {"num_hidden_layers", c.num_hidden_layers},
                             {"num_attention_heads", c.num_attention_heads},
                             {"num_key_value_heads", c.num_key_value_heads},
                             {"head_dim", c.head_dim}},
                            c.num_hidden_layers, where);
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    fail("num_key_value_heads", std::to_string(c.num_key_value_heads) +
                                    " does not divide num_attention_heads " +
                                    std::to_string(c.num_attention_heads));
  }
  const int64_t rotary = c.rotary_dim == 0 ? c.head_dim : c.rotary_dim;
  if (c.positions == "learned" && c.max_position_embeddings <= 0) {
    fail("max_position_embeddings", "must be positive for learned positions");
  }
  if (c.positions == "rope" && (rotary <= 0 || rotary > c.head_dim || rotary % 2 != 0)) {
    fail("partial_rotary_factor", "gives " + std::to_string(rotary) + " rotary dims of a " +
                                      std::to_string(c.head_dim) +
                                      "-dim head; they must be even and within the head");
  }
  if (!(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0)) {
    fail("rms_norm_eps", "must be positive and finite");
  }
  if (!(std::isfinite(c.rope_theta) && c.rope_theta > 0)) {
    fail("rope_theta", "must be positive and finite");
  }
  if (!(std::isfinite(c.rope_factor) && c.rope_factor > 0)) {
    fail("rope factor", "must be positive and finite");
  }
  for (const auto& [key, p] :
       {std::pair<const char*, double>{"attention_dropout", c.attention_dropout},
        {"hidden dropout", c.hidden_dropout},
        {"embedding dropout", c.embedding_dropout}}) {
    if (!(p >= 0 && p < 1)) fail(key, "must be in [0, 1)");
  }
  if (c.max_position_embeddings < 0) fail("max_position_embeddings", "must not be negative");
  if (static_cast<int64_t>(c.layer_windows.size()) != c.num_hidden_layers) {
    fail("layer_types", std::to_string(c.layer_windows.size()) + " windows for " +
                            std::to_string(c.num_hidden_layers) + " layers");
  }
  for (const auto& w : c.layer_windows) {
    if (w && *w <= 0) fail("sliding_window", "must be positive, got " + std::to_string(*w));
  }
  if (c.pad_token_id && (*c.pad_token_id < 0 || *c.pad_token_id >= c.vocab_size)) {
    fail("pad_token_id", std::to_string(*c.pad_token_id) + " is not a row of the " +
                             std::to_string(c.vocab_size) + "-token vocabulary");
  }
}

CausalLMConfig parse_causal_lm_config(std::string_view json_text, const std::string& path) {
  const json j = detail::parse_json_object(json_text, path);
  Fields f(j, path, "");
  CausalLMConfig c;
  read_family(f, c);
  if (c.model_type == "gpt2") {
    read_gpt2(f, c);
    c.dtype = f.string_or("dtype", f.string_or("torch_dtype", ""));
    // A task head's fields (GPT2DoubleHeadsModel's summary) and generation settings.
    std::set<std::string> metadata = kMetadata;
    metadata.insert({"summary_activation", "summary_first_dropout", "summary_proj_to_labels",
                     "summary_type", "summary_use_proj", "task_specific_params"});
    f.refuse_unread(metadata);
    check_causal_lm_config(c, "'" + path + "'");
    return c;
  }
  c.vocab_size = f.integer("vocab_size");
  c.hidden_size = f.integer("hidden_size");
  c.intermediate_size = f.integer("intermediate_size");
  c.num_hidden_layers = f.integer("num_hidden_layers");
  c.num_attention_heads = f.integer("num_attention_heads");
  c.num_key_value_heads = f.integer_or("num_key_value_heads", c.num_attention_heads);
  c.head_dim = f.integer_or("head_dim", 0);
  if (c.head_dim == 0 && !f.has("head_dim") && c.num_attention_heads > 0) {
    if (c.hidden_size % c.num_attention_heads != 0) {
      f.fail("hidden_size", "is not a multiple of num_attention_heads and there is no head_dim");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.max_position_embeddings = f.integer_or("max_position_embeddings", 0);
  c.rms_norm_eps = f.number_or("rms_norm_eps", 1e-6);
  const std::string act = f.string_or("hidden_act", "silu");
  if (act != "silu") {
    f.fail("hidden_act", "'" + act + "': te-cpp builds this family's MLP as SwiGLU (silu)");
  }
  if (f.integer_or("pretraining_tp", 1) != 1) {
    f.fail("pretraining_tp", "slices the projections at training time only; te-cpp supports 1");
  }
  c.attention_dropout = f.number_or("attention_dropout", 0.0);
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", false);
  if (f.has("pad_token_id")) c.pad_token_id = f.integer("pad_token_id");
  c.attention_bias = c.model_type != "mistral" && f.boolean_or("attention_bias", false);
  c.mlp_bias = c.model_type == "llama" && f.boolean_or("mlp_bias", false);
  c.qkv_bias = c.model_type == "qwen2" || c.attention_bias;
  c.qk_norm = c.model_type == "qwen3";
  if (c.model_type == "qwen2" && c.attention_bias) {
    f.fail("attention_bias", "Qwen2 has q/k/v biases and no other; true is not a Qwen2 layout");
  }
  double partial = 1.0;
  read_rope(f, path, c, partial);
  if (!(partial > 0 && partial <= 1)) f.fail("partial_rotary_factor", "must be in (0, 1]");
  // transformers: int(head_dim * partial_rotary_factor).
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
  if (c.num_hidden_layers <= 0 || c.num_hidden_layers > 65536) {
    f.fail("num_hidden_layers",
           std::to_string(c.num_hidden_layers) + " is not in [1, 65536], the layers te-cpp builds");
  }
  read_windows(f, j, c);
  c.dtype = f.string_or("dtype", f.string_or("torch_dtype", ""));
  f.refuse_unread(kMetadata);
  check_causal_lm_config(c, "'" + path + "'");
  return c;
}

namespace detail {

std::pair<std::string, std::string> read_config_text(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path path = dir;
  std::error_code ec;
  if (fs::is_directory(path, ec)) path /= "config.json";
  std::ifstream in(path, std::ios::binary);
  TE_CHECK(in.good(), "config: cannot read '", path.string(),
           "'; a Hugging Face model directory holds its config.json");
  return {std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()),
          path.string()};
}

}  // namespace detail

CausalLMConfig read_causal_lm_config(const std::string& dir) {
  const auto [text, path] = detail::read_config_text(dir);
  return parse_causal_lm_config(text, path);
}

}  // namespace te::hf
