#pragma once

// RoPE as config.json gives it, read as transformers 5.23.0 reads it (modeling_rope_utils.py:
// RotaryEmbeddingConfigMixin's standardize_rope_params and validation, the _compute_*_parameters
// functions): transformers 5's rope_parameters, or the older rope_theta and rope_scaling, and
// partial_rotary_factor; the scaling types te-cpp builds (default, linear, llama3, yarn,
// longrope) turned into the config's factors, every other type or parameter refused by name. The
// one home of RoPE scaling for every family that reads it.

#include <optional>
#include <set>
#include <string>

#include "family.h"

namespace te::hf::detail {

/// Where a family's RoPE differs from transformers' shared rules.
struct RopeRules {
  /// The scaling types its config class accepts (empty: every type te-cpp builds).
  std::set<std::string> types;
  /// rope_type "yarn" or "su" read as "longrope" (Phi3Config.convert_rope_params_to_dict, for
  /// configs saved before the type was renamed).
  bool yarn_is_longrope = false;
  /// A top-level original_max_position_embeddings that transformers puts over rope_parameters'
  /// (Phi3Config's field; standardize_rope_params gives it priority); nullopt: none.
  std::optional<int64_t> original_max_position_embeddings;
  double theta = 10000.0;  ///< the RoPE base when config.json gives none
  /// rope_parameters may be transformers 5's per-layer-type form ({"full_attention": {...},
  /// "sliding_attention": {...}}, Gemma 3's): the full-attention layers' RoPE is read as the
  /// RoPE, the sliding layers' base (default type only) into sliding_rope_theta.
  bool per_layer_type = false;
  /// The RoPE object the config class assumes when config.json gives neither rope_parameters
  /// nor rope_scaling (gpt-oss's yarn: GptOssConfig.__post_init__); null: default RoPE.
  json default_parameters;
};

/// Sets c.rope_theta, rotary_dim, rope_type, rope_factor, rope_freq_factors,
/// rope_long_freq_factors, rope_original_max_position_embeddings, rope_attention_factor and
/// sliding_rope_theta
/// (c.head_dim and c.max_position_embeddings read first). A value given both at the top level
/// and in the object must agree.
void read_rope(Fields& f, CausalLMConfig& c, const RopeRules& rules = {});

/// YaRN as a GGUF file gives it (`keys`' rope.scaling.factor, original_context_length,
/// yarn_beta_fast and yarn_beta_slow; the architecture's other YaRN keys are left unread, so the
/// file is refused with them), as llama.cpp computes it: ggml.c ggml_rope_yarn_corr_dims always
/// floors and ceils the correction range (transformers' truncate true), whatever the checkpoint
/// it was converted from said. c.rope_theta, c.rotary_dim and c.max_position_embeddings first.
void read_gguf_yarn(GgufKeys& keys, const std::string& path, CausalLMConfig& c);

}  // namespace te::hf::detail
