#include "te/hf/config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

#include "te/error.h"

namespace te::hf {

namespace {

using nlohmann::json;

// Fields that cannot change a forward pass: token ids, generation and bookkeeping metadata.
const std::set<std::string> kMetadata = {
    "_name_or_path",  "architectures",      "bos_token_id", "eos_token_id",
    "pad_token_id",   "initializer_range",  "transformers_version", "use_cache",
    "torch_dtype",    "dtype",              "model_type",   "max_window_layers",
    "keys_to_ignore_at_inference", "output_attentions", "output_hidden_states", "return_dict",
};

// Reads fields of one JSON object, remembering which it read; the rest must be metadata.
class Fields {
 public:
  Fields(const json& j, std::string path, std::string what)
      : j_(j), path_(std::move(path)), what_(std::move(what)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& message) const {
    TE_FAIL("config: '", path_, "': ", what_, field, ": ", message);
  }
  bool has(const std::string& key) {
    read_.insert(key);
    return j_.contains(key) && !j_.at(key).is_null();
  }
  int64_t integer(const std::string& key) {
    TE_CHECK(has(key), "config: '", path_, "': ", what_, key,
             " is missing; a config of this model_type needs it");
    return integer_at(key);
  }
  int64_t integer_or(const std::string& key, int64_t fallback) {
    return has(key) ? integer_at(key) : fallback;
  }
  double number_or(const std::string& key, double fallback) {
    if (!has(key)) return fallback;
    if (!j_.at(key).is_number()) fail(key, "expected a number, got " + j_.at(key).dump());
    return j_.at(key).get<double>();
  }
  bool boolean_or(const std::string& key, bool fallback) {
    if (!has(key)) return fallback;
    if (!j_.at(key).is_boolean()) fail(key, "expected true or false, got " + j_.at(key).dump());
    return j_.at(key).get<bool>();
  }
  std::string string_or(const std::string& key, const std::string& fallback) {
    if (!has(key)) return fallback;
    if (!j_.at(key).is_string()) fail(key, "expected a string, got " + j_.at(key).dump());
    return j_.at(key).get<std::string>();
  }
  const json& raw(const std::string& key) {
    read_.insert(key);
    return j_.at(key);
  }
  /// Every field neither read nor metadata is a te::Error naming it.
  void refuse_unread(const std::set<std::string>& metadata) const {
    for (const auto& [key, value] : j_.items()) {
      if (read_.count(key) || metadata.count(key)) continue;
      fail(key, "is not a field te-cpp honours (value " + value.dump() +
                    "); te-cpp builds the model from every field it reads and will not ignore "
                    "one that may change it");
    }
  }

 private:
  int64_t integer_at(const std::string& key) const {
    const json& v = j_.at(key);
    if (!v.is_number_integer()) fail(key, "expected an integer, got " + v.dump());
    return v.get<int64_t>();
  }
  const json& j_;
  std::string path_, what_;
  std::set<std::string> read_;
};

// RoPE: transformers 5's rope_parameters, or the older rope_theta and rope_scaling.
void read_rope(Fields& f, const json& j, const std::string& path, CausalLMConfig& c) {
  c.rope_theta = f.number_or("rope_theta", c.rope_theta);
  c.partial_rotary_factor = f.number_or("partial_rotary_factor", 1.0);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!f.has(key)) continue;
    const json& r = f.raw(key);
    if (!r.is_object()) f.fail(key, "expected an object, got " + r.dump());
    Fields rope(r, path, std::string(key) + ".");
    std::string type = rope.string_or("rope_type", "");
    if (type.empty()) type = rope.string_or("type", "default");
    c.rope_theta = rope.number_or("rope_theta", c.rope_theta);
    c.partial_rotary_factor = rope.number_or("partial_rotary_factor", c.partial_rotary_factor);
    if (type == "linear") {
      c.rope_factor = rope.number_or("factor", 0.0);
      if (!(c.rope_factor > 0)) rope.fail("factor", "linear RoPE scaling needs a positive factor");
    } else if (type != "default") {
      rope.fail("rope_type", "'" + type +
                                 "' RoPE scaling is not supported by te-cpp (it supports "
                                 "'default' and 'linear')");
    }
    c.rope_type = type;
    rope.refuse_unread({});
  }
  (void)j;
}

}  // namespace

CausalLMConfig parse_causal_lm_config(std::string_view json_text, const std::string& path) {
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    TE_FAIL("config: '", path, "' is not JSON: ", e.what());
  }
  TE_CHECK(j.is_object(), "config: '", path, "' is not a JSON object");
  Fields f(j, path, "");
  CausalLMConfig c;
  c.model_type = f.string_or("model_type", "");
  static const std::vector<std::pair<std::string, std::string>> kFamilies = {
      {"llama", "LlamaForCausalLM"},
      {"mistral", "MistralForCausalLM"},
      {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"}};
  const auto family = std::find_if(kFamilies.begin(), kFamilies.end(),
                                   [&](const auto& p) { return p.first == c.model_type; });
  if (family == kFamilies.end()) {
    f.fail("model_type", "'" + c.model_type +
                             "' is not a causal LM family te-cpp loads (llama, mistral, qwen2, "
                             "qwen3)");
  }
  if (f.has("architectures")) {
    const json& a = f.raw("architectures");
    if (!a.is_array()) f.fail("architectures", "expected a list, got " + a.dump());
    for (const json& name : a) {
      if (name != family->second) {
        f.fail("architectures", "entry " + name.dump() + " is not one te-cpp builds for model_type '" +
                                    c.model_type + "' (" + family->second + ")");
      }
    }
  }
  c.vocab_size = f.integer("vocab_size");
  c.hidden_size = f.integer("hidden_size");
  c.intermediate_size = f.integer("intermediate_size");
  c.num_hidden_layers = f.integer("num_hidden_layers");
  c.num_attention_heads = f.integer("num_attention_heads");
  c.num_key_value_heads = f.integer_or("num_key_value_heads", c.num_attention_heads);
  for (const auto& [key, v] :
       {std::pair<const char*, int64_t>{"vocab_size", c.vocab_size},
        {"hidden_size", c.hidden_size},
        {"intermediate_size", c.intermediate_size},
        {"num_hidden_layers", c.num_hidden_layers},
        {"num_attention_heads", c.num_attention_heads},
        {"num_key_value_heads", c.num_key_value_heads}}) {
    if (v <= 0) f.fail(key, "must be positive, got " + std::to_string(v));
  }
  // A bound before anything is sized by it (a hostile config cannot make te-cpp allocate).
  if (c.num_hidden_layers > 65536) {
    f.fail("num_hidden_layers", std::to_string(c.num_hidden_layers) +
                                    " is more than te-cpp builds (at most 65536)");
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    f.fail("num_key_value_heads", std::to_string(c.num_key_value_heads) +
                                      " does not divide num_attention_heads " +
                                      std::to_string(c.num_attention_heads));
  }
  c.head_dim = f.integer_or("head_dim", 0);
  if (c.head_dim == 0) {
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
  c.attention_bias = f.boolean_or("attention_bias", false);
  c.mlp_bias = f.boolean_or("mlp_bias", false);
  c.qkv_bias = c.model_type == "qwen2" || c.attention_bias;
  c.qk_norm = c.model_type == "qwen3";
  if (c.model_type == "qwen2" && c.attention_bias) {
    f.fail("attention_bias", "Qwen2 has q/k/v biases and no other; true is not a Qwen2 layout");
  }
  read_rope(f, j, path, c);
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1)) {
    f.fail("partial_rotary_factor", "must be in (0, 1]");
  }
  // Sliding windows: Mistral's on every layer; Qwen's on the layers layer_types (or, before
  // transformers 5, use_sliding_window with max_window_layers) name.
  std::optional<int64_t> window;
  if (f.has("sliding_window")) window = f.integer("sliding_window");
  const bool qwen = c.model_type == "qwen2" || c.model_type == "qwen3";
  if (qwen && !f.boolean_or("use_sliding_window", false)) window.reset();
  if (window && *window <= 0) f.fail("sliding_window", "must be positive");
  c.layer_windows.assign(static_cast<std::size_t>(c.num_hidden_layers), std::nullopt);
  if (f.has("layer_types")) {
    const json& types = f.raw("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c.num_hidden_layers) {
      f.fail("layer_types", "expected a list of num_hidden_layers entries, got " + types.dump());
    }
    for (std::size_t i = 0; i < types.size(); ++i) {
      if (types[i] == "sliding_attention") {
        if (!window) f.fail("layer_types", "names a sliding_attention layer but there is no window");
        c.layer_windows[i] = window;
      } else if (types[i] != "full_attention") {
        f.fail("layer_types", "entry " + types[i].dump() +
                                  " is not full_attention or sliding_attention");
      }
    }
  } else if (window) {
    const int64_t first = qwen ? f.integer_or("max_window_layers", 0) : 0;
    for (int64_t i = std::max<int64_t>(first, 0); i < c.num_hidden_layers; ++i) {
      c.layer_windows[static_cast<std::size_t>(i)] = window;
    }
  }
  c.dtype = f.string_or("dtype", f.string_or("torch_dtype", ""));
  f.refuse_unread(kMetadata);
  return c;
}

CausalLMConfig read_causal_lm_config(const std::string& dir) {
  namespace fs = std::filesystem;
  fs::path path = dir;
  if (fs::is_directory(path)) path /= "config.json";
  std::ifstream in(path, std::ios::binary);
  TE_CHECK(in.good(), "config: cannot read '", path.string(),
           "'; a Hugging Face model directory holds its config.json");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return parse_causal_lm_config(text, path.string());
}

}  // namespace te::hf
