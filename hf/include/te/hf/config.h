#pragma once

// A Hugging Face model's config.json, as te-cpp builds the model from it. Every field is
// either honoured (it changes the model te-cpp builds), or metadata that cannot change the
// numbers (token ids, the transformers version, the initializer range); any other field, or an
// honoured one with a value te-cpp does not implement, is a te::Error naming it: a config is
// never half-read.
//
// Example:
//   te::hf::CausalLMConfig config = te::hf::read_causal_lm_config("SmolLM2-135M/");

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "te/nn/attention_types.h"

namespace te::hf {

/// A decoder-only language model of a registered family (te/hf/families.h: the Llama family,
/// Llama, Mistral, Qwen2, Qwen3, Phi-3, with pre-RMSNorm layers, RoPE, grouped query attention, a
/// SwiGLU MLP, an optional sliding window per layer, a tied or separate head; Gemma 1, 2 and 3 on
/// the same decoder with 1 + weight RMSNorms, scaled embeddings, GeGLU, and for 2 and 3 norms after
/// the blocks, soft caps and two RoPEs; the mixtures of experts Qwen2-MoE, Qwen3-MoE, Mixtral,
/// OLMoE (full-width q/k norms, clip_qkv) and gpt-oss (attention sinks, a clamped SwiGLU) on it
/// too; and GPT-2, with learned positions, pre-LayerNorm layers with biases everywhere, a fused
/// query/key/value projection, a gelu MLP, a tied head). The fields are what the families differ
/// by.
struct CausalLMConfig {
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  ///< = num_attention_heads when the config has none
  int64_t head_dim = 0;             ///< = hidden_size / num_attention_heads when none
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;  ///< the norms' epsilon (GPT-2: layer_norm_epsilon)
  /// "rope" (the Llama family) or "learned" (GPT-2: a table of max_position_embeddings rows).
  std::string positions = "rope";
  /// "rmsnorm" or "layernorm" (with a bias: GPT-2).
  std::string norm = "rmsnorm";
  /// The MLP's activation slots, as te::nn names them: SwiGLU {"silu", "linear"}, or one slot
  /// (GPT-2's gelu_new is "gelu", the tanh form).
  std::vector<std::string> mlp_activations = {"silu", "linear"};
  /// gpt-oss's clamped SwiGLU ({"clamped_silu", "clamped_linear"}: TE's clamped_swiglu):
  /// (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit).
  double swiglu_limit = 7.0, swiglu_alpha = 1.702;
  /// Query, key and value from one projection (GPT-2's c_attn).
  bool fuse_qkv = false;
  /// Dropout on each block's output (GPT-2's resid_pdrop) and on the embeddings (embd_pdrop);
  /// training only.
  double hidden_dropout = 0.0, embedding_dropout = 0.0;
  /// RoPE: base, the rotated dims of each head (the first rotary_dim; transformers'
  /// int(head_dim * partial_rotary_factor), GGUF's rope.dimension_count; 0: all), and its
  /// scaling ("default"; "linear" with rope_factor; "llama3" and "yarn": rope_freq_factors
  /// computed from rope_factor and the config's other parameters; "longrope": its short and long
  /// factors as given), as transformers 5.23.0's modeling_rope_utils.py computes them.
  double rope_theta = 10000.0;
  /// > 0: the sliding-window layers rotate with a default RoPE of this base instead (Gemma 3's
  /// rope_local_base_freq, rope_parameters.sliding_attention); the others as above.
  double sliding_rope_theta = 0.0;
  int64_t rotary_dim = 0;
  std::string rope_type = "default";
  double rope_factor = 1.0;
  /// Each inverse frequency divided by its own factor (rotary dims / 2 of them; empty: none):
  /// Llama 3's or YaRN's scaling, LongRoPE's short factors, or a GGUF's rope_freqs.weight /
  /// rope_factors_short.weight (RotaryPositionEmbeddingOptions::frequency_factors).
  std::vector<double> rope_freq_factors;
  /// LongRoPE's long factors (GGUF: rope_factors_long.weight), in place of rope_freq_factors for
  /// a sequence longer than rope_original_max_position_embeddings (empty: none).
  std::vector<double> rope_long_freq_factors;
  int64_t rope_original_max_position_embeddings = 0;
  /// cos and sin multiplied by it (YaRN's and LongRoPE's attention factor; 1: none).
  double rope_attention_factor = 1.0;
  double attention_dropout = 0.0;
  /// Biases: q/k/v/o (Llama's attention_bias), q/k/v only (Qwen2), the MLP's (mlp_bias).
  bool attention_bias = false;
  bool qkv_bias = false;
  bool mlp_bias = false;
  /// RMSNorm of queries and keys before RoPE: each head's (Qwen3, Gemma 3), or with
  /// qk_norm_over_heads each token's over all its heads (OLMoE's full-width q_norm, k_norm).
  bool qk_norm = false;
  bool qk_norm_over_heads = false;
  /// > 0: queries, keys and values clamped to [-clip_qkv, clip_qkv] after the projections and
  /// norms (OLMoE's clip_qkv); 0: none.
  double clip_qkv = 0.0;
  /// A learned sink logit per head in each attention's softmax, never masked, its weight dropped
  /// after (gpt-oss's self_attn.sinks: TE's softmax_type "learnable").
  bool attention_sinks = false;
  /// Every RMSNorm (the q/k norms too) scales by 1 + weight, its weights saved zero-centered
  /// (Gemma's RMSNorm: LayerNormOptions::zero_centered_gamma).
  bool zero_centered_norms = false;
  /// A norm on each layer's attention output and MLP output too, before the residual adds
  /// (Gemma 2 and 3: TransformerLayerOptions::post_block_layernorm).
  bool post_block_norms = false;
  /// Multiplies the embeddings, cast to their dtype first (Gemma: sqrt(hidden_size)); 1: none.
  double embedding_multiplier = 1.0;
  /// Multiplies the attention logits (Gemma: query_pre_attn_scalar^-0.5); 0: 1/sqrt(head_dim).
  double attention_scale = 0.0;
  /// cap * tanh(x / cap) on the attention logits before the mask (Gemma 2's
  /// attn_logit_softcapping) and on the head's logits (final_logit_softcapping); 0: none.
  double attn_logit_softcapping = 0.0;
  double final_logit_softcapping = 0.0;
  bool tie_word_embeddings = false;
  /// te's choice, not a checkpoint's: the layers take packed sequences (TE's attn_input_format
  /// "thd" with a padding_causal mask: each sequence attends within itself, RoPE restarting at
  /// each), through CausalLM::forward_packed; forward and step are then refused.
  bool packed_sequences = false;
  /// te's choice: context parallelism in every layer's attention (TE's cp_comm_type; the
  /// sequence splits over the mesh axis the rules give seqlen_cp: te/nn/context_parallel.h).
  std::optional<nn::CpCommType> cp_comm_type;
  /// te's choice: with cp_comm_type, the tokens in TE's load-balanced order (each cp rank's
  /// chunks r and 2·cp-1-r, in rank order: functional::cp_rank_order of ids and labels alike),
  /// so that causal attention gives every rank of the ring the same work; forward takes the ids
  /// so ordered and gives logits in that order (learned positions follow it).
  bool cp_load_balanced = false;
  /// The embedding's padding row (pad_token_id; GGUF: tokenizer.ggml.padding_token_id): its
  /// lookup gradient is zero, as transformers' nn.Embedding(padding_idx=pad_token_id) trains it
  /// (a tied head still trains it). nullopt: none.
  std::optional<int64_t> pad_token_id;
  /// Each layer's sliding window (keys at most this many positions back, the query's own
  /// included), or nullopt for full causal attention.
  std::vector<std::optional<int64_t>> layer_windows;
  /// A mixture of experts (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE, gpt-oss): with num_experts > 0 the
  /// MLP of each layer layer_moe marks is a te::nn::LayerNormMoE of num_experts experts of
  /// moe_intermediate_size, num_experts_per_tok per token, chosen by the top softmax
  /// probabilities, renormalised over the chosen ones when norm_topk_prob (Mixtral's and
  /// gpt-oss's always); the router's logits with a bias when router_bias (gpt-oss), the experts'
  /// projections with biases when mlp_bias; plus a shared expert of
  /// shared_expert_intermediate_size scaled by a sigmoid gate (Qwen2-MoE; 0: none). The other
  /// layers keep the dense MLP of intermediate_size.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  bool router_bias = false;
  int64_t shared_expert_intermediate_size = 0;
  std::vector<bool> layer_moe;
  /// The load-balancing loss's weight in transformers' training loss (router_aux_loss_coef),
  /// and whether that loss counts it (output_router_logits): te::hf::router_aux_loss.
  double router_aux_loss_coef = 0.0;
  bool output_router_logits = false;
  /// The dtype the weights were saved in ("float32", "bfloat16", ...; "" when not stated).
  std::string dtype;
};

/// Checks a config however it was read (`where` names its source in errors): sizes positive and
/// at most 2^24 (layers at most 65536), the key/value heads dividing the heads, an even rotary
/// dim within the head, a positive finite epsilon, RoPE base and factor, one positive window or
/// none per layer, a pad_token_id within the vocabulary. te::Error naming the field otherwise.
void check_causal_lm_config(const CausalLMConfig& config, const std::string& where);

/// Parses config.json's text (`path` names it in errors): te::Error naming the field for a
/// missing required one, a wrong type, an unknown model_type or architecture, or a field or
/// value te-cpp does not honour.
CausalLMConfig parse_causal_lm_config(std::string_view json_text, const std::string& path);
/// Reads `dir`/config.json (or `dir` itself when it names a file).
CausalLMConfig read_causal_lm_config(const std::string& dir);

/// Whether the load-balanced cp order (CausalLMConfig::cp_load_balanced) keeps training the
/// model one process's: it has no dropout outside attention (hidden, embedding), which would
/// draw at a token's place in the reordered tensor rather than its own.
bool cp_load_balance_is_exact(const CausalLMConfig& config);

}  // namespace te::hf
