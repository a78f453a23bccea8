// RoPE scaling from config.json (see rope_scaling.h): each type's parameters read, checked and
// turned into per-frequency factors and an attention factor as transformers 5.23.0's
// modeling_rope_utils.py computes them.

#include "rope_scaling.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>
#include <vector>

namespace te::hf::detail {

namespace {

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

// Every RoPE parameter a config may give, and where each scaling parameter was given (for
// errors: "rope_parameters" or "rope_scaling").
struct RopeParams {
  std::optional<std::string> type;
  std::optional<double> theta, partial, factor, low_freq_factor, high_freq_factor, original,
      attention_factor, beta_fast, beta_slow, mscale, mscale_all_dim;
  std::optional<bool> truncate;
  std::optional<std::vector<double>> short_factor, long_factor;
  std::map<std::string, std::string> given;  // scaling parameter -> the object it was in
};

// The scaling parameters of each type te-cpp builds (rope_theta and partial_rotary_factor go
// with every type), as transformers' _validate_<type>_rope_parameters lists them.
const std::map<std::string, std::set<std::string>>& type_parameters() {
  static const std::map<std::string, std::set<std::string>> kTypes = {
      {"default", {}},
      {"linear", {"factor"}},
      {"llama3",
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}},
      {"yarn",
       {"factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
        "mscale", "mscale_all_dim", "truncate"}},
      {"longrope",
       {"short_factor", "long_factor", "factor", "attention_factor",
        "original_max_position_embeddings"}},
  };
  return kTypes;
}

std::optional<double>* number_slot(RopeParams& p, const std::string& name) {
  const std::map<std::string, std::optional<double> RopeParams::*> kNumbers = {
      {"factor", &RopeParams::factor},
      {"low_freq_factor", &RopeParams::low_freq_factor},
      {"high_freq_factor", &RopeParams::high_freq_factor},
      {"original_max_position_embeddings", &RopeParams::original},
      {"attention_factor", &RopeParams::attention_factor},
      {"beta_fast", &RopeParams::beta_fast},
      {"beta_slow", &RopeParams::beta_slow},
      {"mscale", &RopeParams::mscale},
      {"mscale_all_dim", &RopeParams::mscale_all_dim}};
  const auto it = kNumbers.find(name);
  return it == kNumbers.end() ? nullptr : &(p.*(it->second));
}

std::vector<double> number_list(Fields& rope, const std::string& name) {
  const json& v = rope.raw(name);
  if (!v.is_array()) rope.fail(name, "expected a list of numbers, got " + v.dump());
  std::vector<double> out;
  for (const json& x : v) {
    if (!x.is_number()) rope.fail(name, "expected a list of numbers, got " + v.dump());
    out.push_back(x.get<double>());
  }
  return out;
}

// transformers 5's per-layer-type RoPE (5.23.0 models/gemma3/configuration_gemma3.py
// Gemma3TextConfig.convert_rope_params_to_dict): the sliding layers' base (a default RoPE) into
// c.sliding_rope_theta when given; returns the full-attention layers' object, the RoPE proper.
const json& per_layer_type_rope(const json& r, const Fields& f, CausalLMConfig& c) {
  static const json kNone = json::object();
  for (auto it = r.begin(); it != r.end(); ++it) {
    if ((it.key() != "full_attention" && it.key() != "sliding_attention") ||
        !it.value().is_object()) {
      f.fail("rope_parameters." + it.key(),
             "expected full_attention and sliding_attention objects (transformers' per-layer-type "
             "form), got " +
                 it.value().dump());
    }
  }
  if (r.contains("sliding_attention")) {
    Fields sliding(r.at("sliding_attention"), f.path(), "rope_parameters.sliding_attention.");
    const std::string type = sliding.string_or("rope_type", "default");
    if (type != "default") {
      sliding.fail("rope_type", "'" + type + "': te-cpp rotates sliding layers with default RoPE");
    }
    if (sliding.has("rope_theta")) c.sliding_rope_theta = sliding.number_or("rope_theta", 0);
    sliding.refuse_unread({});
  }
  return r.contains("full_attention") ? r.at("full_attention") : kNone;
}

// One rope_parameters / rope_scaling object's fields into `p`; any other field refused.
void read_object(Fields& f, const char* key, const json& top, RopeParams& p, CausalLMConfig& c,
                 const RopeRules& rules) {
  if (!top.is_object()) f.fail(key, "expected an object, got " + top.dump());
  const bool per_type = rules.per_layer_type && std::string(key) == "rope_parameters";
  const json& r = per_type ? per_layer_type_rope(top, f, c) : top;
  const std::string where = per_type ? "rope_parameters.full_attention" : key;
  Fields rope(r, f.path(), where + ".");
  // transformers 5.23.0 reads yarn's truncate from the top of rope_parameters
  // (modeling_rope_utils.py _compute_yarn_parameters), where the per-layer-type form has none: it
  // always truncates there.
  if (per_type && rope.has("truncate") && !rope.boolean_or("truncate", true)) {
    rope.fail("truncate",
              "false is ignored by transformers in the per-layer-type form (it always truncates); "
              "te-cpp refuses it rather than differ");
  }
  for (const char* name : {"rope_type", "type"}) {
    if (rope.has(name)) {
      settle(p.type, std::optional<std::string>(rope.string_or(name, "")),
             std::string(key) + "." + name, rope);
    }
  }
  if (rope.has("rope_theta")) {
    settle(p.theta, std::optional<double>(rope.number_or("rope_theta", 0)), "rope_theta", rope);
  }
  if (rope.has("partial_rotary_factor")) {
    settle(p.partial, std::optional<double>(rope.number_or("partial_rotary_factor", 0)),
           "partial_rotary_factor", rope);
  }
  for (const auto& item : r.items()) {
    const std::string& name = item.key();
    std::optional<double>* slot = number_slot(p, name);
    const bool list = name == "short_factor" || name == "long_factor";
    if ((!slot && !list && name != "truncate") || !rope.has(name)) continue;  // null: absent
    if (slot) {
      settle(*slot, std::optional<double>(rope.number_or(name, 0)), name, rope);
    } else if (list) {
      auto& factors = name == "short_factor" ? p.short_factor : p.long_factor;
      settle(factors, std::optional<std::vector<double>>(number_list(rope, name)), name, rope);
    } else {
      settle(p.truncate, std::optional<bool>(rope.boolean_or(name, true)), name, rope);
    }
    p.given.emplace(name, where);
  }
  rope.refuse_unread({});
}

// The config's original_max_position_embeddings for a type that takes one: the family's
// top-level field over rope_parameters' (Phi-3), else rope_parameters', else
// max_position_embeddings (standardize_rope_params).
double original_length(const Fields& f, const CausalLMConfig& c, const RopeParams& p,
                       const RopeRules& rules) {
  if (rules.original_max_position_embeddings) {
    const auto top = static_cast<double>(*rules.original_max_position_embeddings);
    if (p.original && *p.original != top) {
      f.fail(p.given.at("original_max_position_embeddings") + ".original_max_position_embeddings",
             "differs from the top-level original_max_position_embeddings " +
                 std::to_string(*rules.original_max_position_embeddings) +
                 ", which transformers uses instead; give them equal");
    }
    return top;
  }
  const double original = p.original.value_or(static_cast<double>(c.max_position_embeddings));
  if (!(original > 0)) {
    f.fail("rope_parameters", c.rope_type +
                                  " RoPE scaling needs a positive "
                                  "original_max_position_embeddings (or max_position_embeddings)");
  }
  return original;
}

// transformers' _compute_llama3_parameters as factors that divide each inverse frequency, the
// form llama.cpp's convert_hf_to_gguf.py writes into rope_freqs.weight: a wavelength 2 pi /
// inv_freq shorter than original / high_freq_factor keeps its frequency (1), one longer than
// original / low_freq_factor is divided by the factor, and the ones between take
// 1 / ((1 - s) / factor + s), s = (original / wavelength - low) / (high - low).
void llama3_scaling(const Fields& f, CausalLMConfig& c, const RopeParams& p,
                    const RopeRules& rules) {
  if (!p.factor || !p.low_freq_factor || !p.high_freq_factor) {
    f.fail("rope_parameters",
           "llama3 RoPE scaling needs factor, low_freq_factor and high_freq_factor (and "
           "original_max_position_embeddings, else max_position_embeddings)");
  }
  const double low = *p.low_freq_factor, high = *p.high_freq_factor;
  const double original = original_length(f, c, p, rules);
  if (!(low > 0 && low < high && original > 0)) {
    f.fail("rope_parameters",
           "llama3 RoPE scaling needs 0 < low_freq_factor < "
           "high_freq_factor and a positive original_max_position_embeddings");
  }
  c.rope_factor = *p.factor;
  c.rope_original_max_position_embeddings = static_cast<int64_t>(original);
  for (int64_t i = 0; i < c.rotary_dim; i += 2) {
    const double inv_freq = 1.0 / std::pow(c.rope_theta, static_cast<double>(i) / c.rotary_dim);
    const double wavelength = 2 * std::acos(-1.0) / inv_freq;
    if (wavelength < original / high) {
      c.rope_freq_factors.push_back(1.0);
    } else if (wavelength > original / low) {
      c.rope_freq_factors.push_back(c.rope_factor);
    } else {
      const double s = (original / wavelength - low) / (high - low);
      c.rope_freq_factors.push_back(1.0 / ((1 - s) / c.rope_factor + s));
    }
  }
}

// YaRN's 0.1 * mscale * ln(scale) + 1 (get_mscale), 1 for a scale of at most 1.
double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

// transformers' _compute_yarn_parameters: inv_freq = interpolation * (1 - e) + extrapolation * e
// with interpolation = extrapolation / factor and e = 1 - ramp, ramp rising linearly from 0 to 1
// over the dims between the correction range of beta_fast and beta_slow rotations (floored and
// ceiled unless truncate is false) in the original length; as factors dividing each inverse
// frequency, 1 / (ramp / factor + 1 - ramp). The attention factor: attention_factor, else
// get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both are non-zero, else
// get_mscale(factor).
void yarn_scaling(const Fields& f, CausalLMConfig& c, const RopeParams& p, const RopeRules& rules) {
  if (!p.factor) f.fail("rope_parameters", "yarn RoPE scaling needs a factor");
  const double factor = *p.factor, base = c.rope_theta;
  const double original = original_length(f, c, p, rules);
  c.rope_factor = factor;
  c.rope_original_max_position_embeddings = static_cast<int64_t>(original);
  if (p.attention_factor) {
    c.rope_attention_factor = *p.attention_factor;
  } else if (p.mscale.value_or(0) != 0 && p.mscale_all_dim.value_or(0) != 0) {
    c.rope_attention_factor =
        yarn_mscale(factor, *p.mscale) / yarn_mscale(factor, *p.mscale_all_dim);
  } else {
    c.rope_attention_factor = yarn_mscale(factor, 1.0);
  }
  // `or`: a beta of 0 takes the default too.
  const double beta_fast = p.beta_fast.value_or(0) != 0 ? *p.beta_fast : 32.0;
  const double beta_slow = p.beta_slow.value_or(0) != 0 ? *p.beta_slow : 1.0;
  const double dim = static_cast<double>(c.rotary_dim);
  auto correction_dim = [&](double rotations) {
    return dim * std::log(original / (rotations * 2 * std::acos(-1.0))) / (2 * std::log(base));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (p.truncate.value_or(true)) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // transformers' guard against a zero-width ramp
  for (int64_t i = 0; i < c.rotary_dim / 2; ++i) {
    const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
    c.rope_freq_factors.push_back(1.0 / (ramp / factor + 1.0 - ramp));
  }
}

// transformers' _compute_longrope_parameters: the short factors, or for a sequence longer than
// the original length the long ones, divide the inverse frequencies; the attention factor is
// attention_factor, else sqrt(1 + ln(factor) / ln(original)) for a factor above 1 (factor:
// given, else max_position_embeddings / original), else 1.
void longrope_scaling(const Fields& f, CausalLMConfig& c, const RopeParams& p,
                      const RopeRules& rules) {
  const std::size_t pairs = static_cast<std::size_t>(c.rotary_dim / 2);
  for (const auto& [name, list] :
       {std::pair{"short_factor", &p.short_factor}, {"long_factor", &p.long_factor}}) {
    if (!*list) f.fail("rope_parameters", std::string("longrope RoPE scaling needs ") + name);
    if ((*list)->size() != pairs) {
      f.fail(p.given.at(name) + "." + name, "has " + std::to_string((*list)->size()) +
                                                " factors for " + std::to_string(pairs) +
                                                " rotary pairs (the rotary dims / 2)");
    }
  }
  const double original = original_length(f, c, p, rules);
  c.rope_original_max_position_embeddings = static_cast<int64_t>(original);
  const double factor =
      p.factor.value_or(static_cast<double>(c.max_position_embeddings) / original);
  c.rope_factor = factor;  // a non-positive one is refused with the config
  c.rope_attention_factor = p.attention_factor.value_or(
      factor <= 1.0 ? 1.0 : std::sqrt(1 + std::log(factor) / std::log(original)));
  c.rope_freq_factors = *p.short_factor;
  c.rope_long_freq_factors = *p.long_factor;
}

// The type's own parameters: each given one must be the type's; then its factors.
void read_scaling(const Fields& f, CausalLMConfig& c, const RopeParams& p, const RopeRules& rules) {
  const auto& types = type_parameters();
  const auto type = types.find(c.rope_type);
  if (type == types.end() || (!rules.types.empty() && !rules.types.count(c.rope_type))) {
    std::string known;
    for (const auto& [name, params] : types) {
      if (rules.types.empty() || rules.types.count(name))
        known += (known.empty() ? "'" : ", '") + name + "'";
    }
    f.fail("rope_parameters.rope_type", "'" + c.rope_type +
                                            "' RoPE scaling is not supported by te-cpp for " +
                                            c.model_type + " (it supports " + known + ")");
  }
  for (const auto& [name, where] : p.given) {
    if (type->second.count(name)) continue;
    f.fail(where + "." + name, "is not a parameter of RoPE type '" + c.rope_type +
                                   "', this config's type (it is another scaling type's)");
  }
  if (c.rope_type == "linear") {
    if (!p.factor) f.fail("rope_parameters", "linear RoPE scaling needs a factor");
    c.rope_factor = *p.factor;
  } else if (c.rope_type == "llama3") {
    llama3_scaling(f, c, p, rules);
  } else if (c.rope_type == "yarn") {
    yarn_scaling(f, c, p, rules);
  } else if (c.rope_type == "longrope") {
    longrope_scaling(f, c, p, rules);
  }
}

}  // namespace

void read_gguf_yarn(GgufKeys& keys, const std::string& path, CausalLMConfig& c) {
  RopeParams p;
  p.factor = keys.number("rope.scaling.factor");
  if (!p.factor || !(*p.factor > 0)) {
    keys.fail("rope.scaling.factor", "is missing or not positive; yarn RoPE scaling needs it");
  }
  // llama.cpp: n_ctx_orig_yarn, else the training context.
  const int64_t original =
      keys.integer("rope.scaling.original_context_length").value_or(c.max_position_embeddings);
  if (original <= 0) {
    keys.fail("rope.scaling.original_context_length",
              "is missing or not positive, and so is context_length; yarn RoPE scaling needs the "
              "original context");
  }
  p.original = static_cast<double>(original);
  p.beta_fast = keys.number("rope.scaling.yarn_beta_fast");
  p.beta_slow = keys.number("rope.scaling.yarn_beta_slow");
  p.truncate = true;
  c.rope_type = "yarn";
  static const json kNone = json::object();
  yarn_scaling(Fields(kNone, path, "", "gguf"), c, p, {});
}

void read_rope(Fields& f, CausalLMConfig& c, const RopeRules& rules) {
  RopeParams p;
  if (f.has("rope_theta")) p.theta = f.number_or("rope_theta", 0);
  if (f.has("partial_rotary_factor")) p.partial = f.number_or("partial_rotary_factor", 0);
  bool given = false;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!f.has(key)) continue;
    read_object(f, key, f.raw(key), p, c, rules);
    given = true;
  }
  // Read as if given (its errors name rope_parameters, though the family supplied it).
  if (!given && rules.default_parameters.is_object()) {
    read_object(f, "rope_parameters", rules.default_parameters, p, c, rules);
  }
  c.rope_type = p.type.value_or("default");
  // Phi3Config.convert_rope_params_to_dict (transformers 5.23.0 configuration_phi3.py): the
  // earlier names "su" and "yarn" are longrope.
  if (rules.yarn_is_longrope && (c.rope_type == "yarn" || c.rope_type == "su")) {
    c.rope_type = "longrope";
  }
  c.rope_theta = p.theta.value_or(rules.theta);
  const double partial = p.partial.value_or(1.0);
  if (!(partial > 0 && partial <= 1)) f.fail("partial_rotary_factor", "must be in (0, 1]");
  // transformers: int(head_dim * partial_rotary_factor).
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
  read_scaling(f, c, p, rules);
}

}  // namespace te::hf::detail
