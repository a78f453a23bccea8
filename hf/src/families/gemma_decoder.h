#pragma once

// The decoder Gemma 2 and Gemma 3 share (transformers 5.23.0 models/gemma2/modeling_gemma2.py,
// models/gemma3/modeling_gemma3.py): the shared RoPE decoder (rope_decoder.h) with RMSNorms
// scaling by 1 + weight, a norm after the attention and after the MLP as well as before each,
// embeddings times sqrt(hidden_size), a GeGLU MLP (hidden_activation gelu_pytorch_tanh), logits
// scaled by query_pre_attn_scalar^-0.5 and optionally soft-capped before the mask
// (attn_logit_softcapping), the head's logits optionally soft-capped (final_logit_softcapping),
// and sliding-window layers (layer_types, or a pattern). Each family's file gives its config
// class's defaults and its own fields.

#include "rope_decoder.h"

namespace te::hf::detail {

/// What Gemma2Config and Gemma3TextConfig default differently.
struct GemmaDefaults {
  double attn_logit_softcapping = 0, final_logit_softcapping = 0;  ///< 0: none
  /// Whether the model applies attn_logit_softcapping (Gemma3Attention in 5.23.0 keeps it but
  /// never passes it to the attention: a value is refused, null read past).
  bool applies_attn_softcap = true;
  /// Without layer_types, layer i slides unless (i + 1) % pattern == 0 (Gemma 2: 2; Gemma 3:
  /// sliding_window_pattern, 6 when absent).
  int64_t sliding_window_pattern = 2;
  /// Gemma 3: q/k RMSNorms (1 + weight) before RoPE.
  bool qk_norm = false;
  /// Gemma 3: rope_parameters may give the full and the sliding layers' RoPE apart
  /// (RopeRules::per_layer_type).
  bool rope_per_layer_type = false;
  double rope_theta = 10000.0;             ///< the (global layers') RoPE base when none is given
  int64_t max_position_embeddings = 8192;  ///< when config.json gives none
};

/// Refuses a GGUF file's RoPE scaling (rope.scaling.*, rope_freqs.weight, LongRoPE's factors):
/// transformers' GGUF loader reads none of it for Gemma 2 and 3, so their layers rotate unscaled.
void refuse_gguf_rope_scaling(GgufKeys& k, const CausalLMConfig& c);

/// config.json's fields of a Gemma 2 or 3 decoder, every one honoured or refused by name.
void read_gemma_config(Fields& f, CausalLMConfig& c, const GemmaDefaults& defaults);

/// What every Gemma (1, 2, 3) shares after the RoPE decoder's fields: the 1 + weight RMSNorms,
/// embeddings times sqrt(hidden_size) (set_gemma_common), attention_bias, causal attention only
/// (use_bidirectional_attention refused).
void read_gemma_common(Fields& f, CausalLMConfig& c);
/// The 1 + weight RMSNorms and embeddings times sqrt(hidden_size), however the config is read.
void set_gemma_common(CausalLMConfig& c);

/// llama.cpp's names of Gemma 2's and 3's tensors (gguf-py constants.py MODEL_ARCH.GEMMA2 and
/// GEMMA3: q/k norms and output.weight are Gemma 3's).
extern const GgufNames kGemmaGguf;

}  // namespace te::hf::detail
