#include "te/hf/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

#include "families/family.h"
#include "te/error.h"

namespace te::hf {

namespace {

using detail::Family;
using detail::Fields;
using detail::find_family;
using detail::kMetadata;
using nlohmann::json;

// model_type and architectures: which registered family, and that the file is its causal LM.
const Family& read_family(Fields& f, CausalLMConfig& c) {
  c.model_type = f.string_or("model_type", "");
  const Family* family = find_family(c.model_type);
  if (family == nullptr) {
    f.fail("model_type", "'" + c.model_type + "' is not a causal LM family te-cpp loads (" +
                             causal_lm_family_names() +
                             "; a bert encoder loads with te::hf::load_encoder)");
  }
  if (!f.has("architectures")) return *family;
  const json& a = f.raw("architectures");
  if (!a.is_array()) f.fail("architectures", "expected a list, got " + a.dump());
  for (const json& name : a) {
    if (name != family->info.architecture) {
      f.fail("architectures", "entry " + name.dump() +
                                  " is not one te-cpp builds for model_type '" + c.model_type +
                                  "' (" + family->info.architecture + ")");
    }
  }
  return *family;
}

// The RoPE fields: base, factor, per-pair frequency factors, LongRoPE's original length and the
// attention factor.
void check_rope(const CausalLMConfig& c, int64_t rotary,
                const std::function<void(const std::string&, const std::string&)>& fail) {
  if (!(std::isfinite(c.rope_theta) && c.rope_theta > 0)) {
    fail("rope_theta", "must be positive and finite");
  }
  if (!(std::isfinite(c.rope_factor) && c.rope_factor > 0)) {
    fail("rope factor", "must be positive and finite");
  }
  for (const auto& [what, factors] : {std::pair<const char*, const std::vector<double>*>{
                                          "rope frequency factors", &c.rope_freq_factors},
                                      {"rope long frequency factors", &c.rope_long_freq_factors}}) {
    if (!factors->empty() && static_cast<int64_t>(factors->size()) * 2 != rotary) {
      fail(what, std::to_string(factors->size()) + " for " + std::to_string(rotary) +
                     " rotary dims (one per pair)");
    }
    for (const double f : *factors) {
      if (!(std::isfinite(f) && f > 0)) fail(what, "must be positive and finite");
    }
  }
  if (!c.rope_long_freq_factors.empty() && c.rope_original_max_position_embeddings <= 0) {
    fail("original_max_position_embeddings",
         "must be positive with LongRoPE's long factors (the length beyond which they apply)");
  }
  if (!(std::isfinite(c.rope_attention_factor) && c.rope_attention_factor > 0)) {
    fail("rope attention factor", "must be positive and finite");
  }
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
  check_rope(c, rotary, fail);
  for (const auto& [key, p] :
       {std::pair<const char*, double>{"attention_dropout", c.attention_dropout},
        {"hidden dropout", c.hidden_dropout},
        {"embedding dropout", c.embedding_dropout}}) {
    if (!(p >= 0 && p < 1)) fail(key, "must be in [0, 1)");
  }
  if (c.max_position_embeddings < 0) fail("max_position_embeddings", "must not be negative");
  for (const auto& [key, v] :
       {std::pair<const char*, double>{"query_pre_attn_scalar", c.attention_scale},
        {"sliding rope_theta", c.sliding_rope_theta},
        {"attn_logit_softcapping", c.attn_logit_softcapping},
        {"final_logit_softcapping", c.final_logit_softcapping}}) {
    if (!(std::isfinite(v) && v >= 0)) fail(key, "must be finite and positive (0: none)");
  }
  if (!(std::isfinite(c.embedding_multiplier) && c.embedding_multiplier > 0)) {
    fail("embedding multiplier", "must be positive and finite");
  }
  if (!(std::isfinite(c.swiglu_limit) && c.swiglu_limit > 0)) {
    fail("swiglu_limit", "must be positive and finite");
  }
  if (!std::isfinite(c.swiglu_alpha)) fail("swiglu_alpha", "must be finite");
  if (!(std::isfinite(c.clip_qkv) && c.clip_qkv >= 0)) {
    fail("clip_qkv", "must be positive and finite (0 or null: none)");
  }
  if (c.num_experts > 0) {
    if (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts) {
      fail("num_experts_per_tok", std::to_string(c.num_experts_per_tok) + " is not in [1, " +
                                      std::to_string(c.num_experts) + "] (the experts)");
    }
    if (static_cast<int64_t>(c.layer_moe.size()) != c.num_hidden_layers) {
      fail("mlp_only_layers", std::to_string(c.layer_moe.size()) + " sparse-layer flags for " +
                                  std::to_string(c.num_hidden_layers) + " layers");
    }
    detail::check_model_sizes(
        {{"num_experts", c.num_experts}, {"moe_intermediate_size", c.moe_intermediate_size}},
        c.num_hidden_layers, where);
  }
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
  const Family& family = read_family(f, c);
  family.read_config(f, c);
  c.dtype = f.string_or("dtype", f.string_or("torch_dtype", ""));
  std::set<std::string> metadata = kMetadata;
  metadata.insert(family.metadata.begin(), family.metadata.end());
  f.refuse_unread(metadata);
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

bool cp_load_balance_is_exact(const CausalLMConfig& config) {
  return config.hidden_dropout == 0 && config.embedding_dropout == 0;
}

}  // namespace te::hf
