// The shared Gemma decoder's config fields (see gemma_decoder.h).

#include "gemma_decoder.h"

#include <cmath>

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

}  // namespace

void read_gemma_common(Fields& f, CausalLMConfig& c) {
  c.attention_bias = f.boolean_or("attention_bias", false);
  c.qkv_bias = c.attention_bias;
  if (f.boolean_or("use_bidirectional_attention", false)) {
    f.fail("use_bidirectional_attention", "te-cpp builds Gemma causal; set it false or null");
  }
  set_gemma_common(c);
}

void set_gemma_common(CausalLMConfig& c) {
  c.zero_centered_norms = true;
  // GemmaModel / Gemma2Model: hidden_size**0.5, cast to the embeddings' dtype.
  c.embedding_multiplier = std::sqrt(static_cast<double>(c.hidden_size));
}

void read_gemma_config(Fields& f, CausalLMConfig& c, const GemmaDefaults& gemma) {
  DecoderDefaults defaults;  // Gemma2Config's and Gemma3TextConfig's
  defaults.activation_field = "hidden_activation";
  defaults.activation = "gelu_pytorch_tanh";
  defaults.head_dim = 256;
  defaults.tie_word_embeddings = true;
  defaults.pad_token_id = 0;
  defaults.rope.theta = gemma.rope_theta;
  defaults.rope.per_layer_type = gemma.rope_per_layer_type;
  defaults.max_position_embeddings = gemma.max_position_embeddings;
  read_rope_decoder_config(f, c, defaults);
  if (c.rotary_dim != c.head_dim) {
    f.fail("partial_rotary_factor", "Gemma's rotary embedding rotates whole heads; te-cpp takes 1");
  }
  read_gemma_common(f, c);
  c.post_block_norms = true;
  c.qk_norm = gemma.qk_norm;
  // Gemma2Attention: query_pre_attn_scalar**-0.5.
  const double scalar = f.number_or("query_pre_attn_scalar", 256);
  if (!(std::isfinite(scalar) && scalar > 0)) {
    f.fail("query_pre_attn_scalar", "must be positive and finite");
  }
  c.attention_scale = std::pow(scalar, -0.5);
  if (gemma.applies_attn_softcap) {
    c.attn_logit_softcapping =
        read_softcap(f, "attn_logit_softcapping", gemma.attn_logit_softcapping);
  } else if (f.has("attn_logit_softcapping")) {
    f.fail("attn_logit_softcapping",
           "transformers 5.23.0's Gemma3Attention keeps it but never applies it; te-cpp "
           "refuses a value rather than choose (give null)");
  }
  c.final_logit_softcapping =
      read_softcap(f, "final_logit_softcapping", gemma.final_logit_softcapping);
  read_alternating_windows(f, c, gemma.sliding_window_pattern, 4096);
}

void refuse_gguf_rope_scaling(GgufKeys& k, const CausalLMConfig& c) {
  if (c.rope_type != "default" || !c.rope_freq_factors.empty() ||
      !c.rope_long_freq_factors.empty()) {
    k.fail("rope.scaling.type",
           "this file scales its RoPE ('" + c.rope_type +
               "', or rope_freqs.weight / rope_factors_*.weight), which transformers' GGUF loader "
               "does not read for Gemma (its layers rotate unscaled); te-cpp refuses the file "
               "rather than differ");
  }
}

const GgufNames kGemmaGguf = {{{"model.embed_tokens.weight", "token_embd.weight"},
                               {"model.norm.weight", "output_norm.weight"},
                               {"lm_head.weight", "output.weight"}},
                              {{"input_layernorm.weight", "attn_norm.weight"},
                               {"self_attn.q_proj.weight", "attn_q.weight"},
                               {"self_attn.k_proj.weight", "attn_k.weight"},
                               {"self_attn.v_proj.weight", "attn_v.weight"},
                               {"self_attn.o_proj.weight", "attn_output.weight"},
                               {"self_attn.q_norm.weight", "attn_q_norm.weight"},
                               {"self_attn.k_norm.weight", "attn_k_norm.weight"},
                               {"post_attention_layernorm.weight", "post_attention_norm.weight"},
                               {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
                               {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
                               {"mlp.gate_proj.weight", "ffn_gate.weight"},
                               {"mlp.up_proj.weight", "ffn_up.weight"},
                               {"mlp.down_proj.weight", "ffn_down.weight"}}};

}  // namespace te::hf::detail
