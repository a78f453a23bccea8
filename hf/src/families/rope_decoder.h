#pragma once

// The decoder Llama, Mistral, Qwen2, Qwen3, Phi-3 and Gemma share (transformers' LlamaModel
// layout): pre-RMSNorm layers, RoPE, grouped query attention, a gated MLP, a tied or separate
// head. Each of those families' files reads the shared fields here, then its own (biases, q/k
// norms, sliding windows, Gemma's norms after the blocks).

#include "family.h"
#include "rope_scaling.h"

namespace te::hf::detail {

/// What a family's config class assumes where config.json is silent (LlamaConfig's by default;
/// Gemma 2's: transformers 5.23.0 models/gemma2/configuration_gemma2.py), and its RoPE rules.
struct DecoderDefaults {
  int64_t max_position_embeddings = 0;  ///< 0: none
  double rms_norm_eps = 1e-6;
  /// The field naming the gated MLP's activation (Gemma's hidden_activation); nullptr: the
  /// family's activation is fixed, the family sets it (gpt-oss, whose hidden_act is unused).
  const char* activation_field = "hidden_act";
  const char* activation = "silu";  ///< when that field is absent
  /// "gelu" there means the tanh form (GemmaConfig.__post_init__, transformers 5.23.0).
  bool gelu_means_tanh = false;
  /// head_dim when there is none; 0: hidden_size / num_attention_heads.
  int64_t head_dim = 0;
  bool tie_word_embeddings = false;
  std::optional<int64_t> pad_token_id;
  RopeRules rope;
};

/// config.json's shared fields: sizes, the gated MLP's activation (silu or gelu_pytorch_tanh),
/// pretraining_tp, attention_dropout, tie_word_embeddings, pad_token_id, RoPE (rope_scaling.h).
/// Every layer starts with no sliding window.
void read_rope_decoder_config(Fields& f, CausalLMConfig& c, const DecoderDefaults& defaults = {});

/// Qwen3's and Qwen3-MoE's attention: the shared fields, optional q/k/v/o biases
/// (attention_bias), per-head q/k RMSNorms.
void read_qwen3_attention(Fields& f, CausalLMConfig& c);

/// Qwen2's and Qwen3's windows: only with use_sliding_window, on the layers layer_types names
/// sliding_attention (or, without it, from max_window_layers on: 28 when absent), of
/// sliding_window positions (4096 when absent, none when null).
void read_qwen_windows(Fields& f, CausalLMConfig& c);

/// Windows on alternating layers (Gemma 2's and 3's, gpt-oss's): layer_types, or the config
/// class's default, sliding_attention where (i + 1) % pattern != 0 (Gemma2Config /
/// Gemma3TextConfig / GptOssConfig.__post_init__); a sliding layer sees sliding_window keys
/// (default_window when absent); a null window with a sliding layer is refused.
void read_alternating_windows(Fields& f, CausalLMConfig& c, int64_t pattern,
                              int64_t default_window);

/// transformers' names: model.embed_tokens, model.layers.N.{input_layernorm, self_attn.{q,k,v,o}
/// _proj, q_norm, k_norm, sinks, post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm,
/// lm_head; the biases, q/k norms and attention sinks the config has. With post_block_norms (Gemma
/// 2, 3) post_attention_layernorm is the attention output's norm, pre_feedforward_layernorm the
/// MLP's and post_feedforward_layernorm the MLP output's.
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
