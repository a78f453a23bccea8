// Gemma 2: transformers' Gemma2ForCausalLM (5.23.0 models/gemma2/modeling_gemma2.py and
// configuration_gemma2.py). The shared decoder with: RMSNorms scaling by 1 + weight, a norm
// after the attention and after the MLP as well as before each, embeddings times
// sqrt(hidden_size), a GeGLU MLP (hidden_activation gelu_pytorch_tanh), logits scaled by
// query_pre_attn_scalar^-0.5 and soft-capped (attn_logit_softcapping) before the mask, the head's
// logits soft-capped (final_logit_softcapping), and sliding-window layers (layer_types; by
// default every other one from layer 0). config.json's hidden_act is not Gemma2Config's field
// and transformers does not read it. te-cpp reads no GGUF file of it.

#include <cmath>

#include "rope_decoder.h"

namespace te::hf::detail {

namespace {

// A soft cap: `fallback` when absent, none (0) when null, else positive.
double read_softcap(Fields& f, const std::string& key, double fallback) {
  if (!f.contains(key)) return fallback;
  if (!f.has(key)) return 0.0;
  const double cap = f.number_or(key, 0.0);
  if (!(std::isfinite(cap) && cap > 0)) f.fail(key, "must be positive and finite, or null (none)");
  return cap;
}

// layer_types, or Gemma2Config's default: sliding_attention where (i + 1) % 2 != 0; a sliding
// layer sees sliding_window keys (4096 when absent).
void read_windows(Fields& f, CausalLMConfig& c) {
  std::optional<int64_t> window = 4096;
  if (f.contains("sliding_window")) {
    window.reset();
    if (f.has("sliding_window")) window = f.integer("sliding_window");
  }
  std::vector<bool> sliding;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) sliding.push_back((i + 1) % 2 != 0);
  if (f.has("layer_types")) {
    const json& types = f.raw("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c.num_hidden_layers) {
      f.fail("layer_types", "expected a list of num_hidden_layers entries, got " + types.dump());
    }
    for (std::size_t i = 0; i < types.size(); ++i) {
      if (types[i] != "full_attention" && types[i] != "sliding_attention") {
        f.fail("layer_types",
               "entry " + types[i].dump() + " is not full_attention or sliding_attention");
      }
      sliding[i] = types[i] == "sliding_attention";
    }
  }
  for (std::size_t i = 0; i < sliding.size(); ++i) {
    if (!sliding[i]) continue;
    if (!window) f.fail("sliding_window", "is null but layer " + std::to_string(i) + " slides");
    c.layer_windows[i] = window;
  }
}

void read_config(Fields& f, CausalLMConfig& c) {
  DecoderDefaults defaults;  // Gemma2Config's
  defaults.activation_field = "hidden_activation";
  defaults.activation = "gelu_pytorch_tanh";
  defaults.head_dim = 256;
  defaults.tie_word_embeddings = true;
  defaults.pad_token_id = 0;
  read_rope_decoder_config(f, c, defaults);
  if (c.rotary_dim != c.head_dim) {
    f.fail("partial_rotary_factor", "Gemma2RotaryEmbedding rotates whole heads; te-cpp takes 1");
  }
  c.attention_bias = f.boolean_or("attention_bias", false);
  c.qkv_bias = c.attention_bias;
  if (f.boolean_or("use_bidirectional_attention", false)) {
    f.fail("use_bidirectional_attention", "te-cpp builds Gemma 2 causal; set it false or null");
  }
  c.zero_centered_norms = true;
  c.post_block_norms = true;
  // Gemma2Model: hidden_size**0.5; Gemma2Attention: query_pre_attn_scalar**-0.5.
  c.embedding_multiplier = std::sqrt(static_cast<double>(c.hidden_size));
  const double scalar = f.number_or("query_pre_attn_scalar", 256);
  if (!(std::isfinite(scalar) && scalar > 0)) {
    f.fail("query_pre_attn_scalar", "must be positive and finite");
  }
  c.attention_scale = std::pow(scalar, -0.5);
  c.attn_logit_softcapping = read_softcap(f, "attn_logit_softcapping", 50.0);
  c.final_logit_softcapping = read_softcap(f, "final_logit_softcapping", 30.0);
  read_windows(f, c);
}

}  // namespace

const Family& gemma2_family() {
  static const Family kFamily = [] {
    Family f = rope_decoder_family({"gemma2", "Gemma2ForCausalLM", "", "Gemma 2"}, read_config);
    // hidden_act: Gemma2Config has no such field (hidden_activation is read); cache_implementation:
    // generate()'s cache choice.
    f.metadata = {"hidden_act", "cache_implementation"};
    return f;
  }();
  return kFamily;
}

}  // namespace te::hf::detail
