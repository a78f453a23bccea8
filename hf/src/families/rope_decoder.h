#pragma once

// The decoder Llama, Mistral, Qwen2 and Qwen3 share (transformers' LlamaModel layout):
// pre-RMSNorm layers, RoPE, grouped query attention, a SwiGLU MLP, a tied or separate head. Each
// of those families' files reads the shared fields here, then its own (biases, q/k norms,
// sliding windows).

#include "family.h"
#include "rope_scaling.h"

namespace te::hf::detail {

/// What a family's config class assumes where config.json is silent, and its RoPE rules.
struct RopeDecoderRules {
  int64_t max_position_embeddings = 0;  ///< 0: none
  double rms_norm_eps = 1e-6;
  RopeRules rope;
};

/// config.json's shared fields: sizes, hidden_act (silu), pretraining_tp, attention_dropout,
/// tie_word_embeddings, pad_token_id, RoPE (rope_scaling.h). Every layer starts with no sliding
/// window.
void read_rope_decoder_config(Fields& f, CausalLMConfig& c, const RopeDecoderRules& rules = {});

/// Qwen2's and Qwen3's windows: only with use_sliding_window, on the layers layer_types names
/// sliding_attention (or, without it, from max_window_layers on: 28 when absent), of
/// sliding_window positions (4096 when absent, none when null).
void read_qwen_windows(Fields& f, CausalLMConfig& c);

/// transformers' names: model.embed_tokens, model.layers.N.{input_layernorm, self_attn.{q,k,v,o}
/// _proj, q_norm, k_norm, post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm,
/// lm_head; the biases and q/k norms the config has.
WeightMap rope_decoder_weight_map(const CausalLMConfig& c);

/// The RoPE tables older checkpoints keep (rotary_emb.inv_freq).
bool rope_decoder_derived(const std::string& name, const std::string& prefix);

/// A family of this decoder: its entry, its config reader, the shared weight map and derived
/// tensors, and llama.cpp's names when it has a GGUF architecture (rows interleaved as the
/// converter writes Llama's when `interleaved_qk`).
Family rope_decoder_family(FamilyInfo info, void (*read_config)(Fields&, CausalLMConfig&),
                           bool interleaved_qk = false);

/// llama.cpp's names for the same tensors (convert_hf_to_gguf.py's, as transformers' GGUF
/// loader maps them back).
extern const GgufNames kRopeDecoderGguf;

}  // namespace te::hf::detail
