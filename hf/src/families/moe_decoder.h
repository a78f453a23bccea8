#pragma once

// The mixture-of-experts decoders on the Llama layout (Qwen2-MoE, Qwen3-MoE, Mixtral, OLMoE,
// gpt-oss): the
// shared decoder of rope_decoder.h whose MLPs (all, or those the config picks) are a router and
// experts, and for Qwen2-MoE a gated shared expert (CausalLMConfig's num_experts ...).

#include "rope_decoder.h"

namespace te::hf::detail {

/// How a family's config.json names its experts' fields.
struct MoeFields {
  /// The expert count's field: "num_experts" (Qwen; transformers 5 also writes Qwen3-MoE's as
  /// "num_local_experts", which is read too) or "num_local_experts" (Mixtral).
  const char* experts = "num_experts";
  /// Qwen's moe_intermediate_size, decoder_sparse_step, mlp_only_layers and norm_topk_prob;
  /// false: every layer sparse, experts of intermediate_size, renormalised as below.
  bool qwen = true;
  /// Qwen2-MoE's shared expert (shared_expert_intermediate_size) and its sigmoid gate.
  bool shared_expert = false;
  /// Without qwen: the choice renormalised as norm_topk_prob says (OLMoE, false when absent),
  /// else always (Mixtral's and gpt-oss's routers).
  bool norm_topk_prob_field = false;
  /// router_aux_loss_coef when absent (the config class's default).
  double aux_loss_coef = 0.001;
};

/// Reads the experts' fields (after read_rope_decoder_config): counts, sizes, which layers are
/// sparse, the renormalisation; router_aux_loss_coef and output_router_logits (whether the
/// training loss adds it: te::hf::router_aux_loss).
void read_moe_config(Fields& f, CausalLMConfig& c, const MoeFields& fields);

/// transformers' names of a sparse layer's tensors: the block ("mlp." or "block_sparse_moe.")
/// holding gate.weight [experts, hidden] and experts.N.{gate, up, down}.weight (their names:
/// "gate_proj"... or Mixtral's "w1", "w3", "w2"), and shared_expert.{gate,up,down}_proj and
/// shared_expert_gate when the config has a shared expert.
struct MoeNames {
  const char* block = "mlp.";
  const char* gate = "gate_proj";
  const char* up = "up_proj";
  const char* down = "down_proj";
};

/// rope_decoder_weight_map with each sparse layer's MLP replaced by its router and experts
/// (te's layers.N.moe.*).
WeightMap moe_decoder_weight_map(const CausalLMConfig& c, const MoeNames& names);

/// llama.cpp's names of the layouts saved expert by expert (convert_hf_to_gguf.py's Qwen2MoeModel,
/// which Qwen3MoeModel inherits, and OlmoeModel, a copy of it): the rope decoder's, the router as
/// ffn_gate_inp.weight, the experts stacked as ffn_{gate,up,down}_exps.weight [experts, out, in],
/// Qwen2-MoE's shared expert as ffn_{gate,up,down}_shexp.weight and its gate as
/// ffn_gate_inp_shexp.weight.
const GgufNames& experts_gguf();

/// How a GGUF architecture keeps its experts (llama.cpp's src/models/*.cpp).
struct MoeGguf {
  /// llama.cpp's graph renormalises the chosen experts' weights (qwen3moe, Mixtral's llama) or
  /// not (qwen2moe): GGUF has no norm_topk_prob.
  bool renormalise = true;
  /// A shared expert of expert_shared_feed_forward_length (else feed_forward_length).
  bool shared = false;
  /// The experts are of feed_forward_length (Mixtral's llama), not expert_feed_forward_length
  /// (else feed_forward_length / experts used, as llama.cpp's qwen*moe).
  bool ffn_length = false;
  /// expert_feed_forward_length must be given (gpt-oss: llama.cpp reads it without a default).
  bool ffn_length_required = false;
};

/// A GGUF file's experts (llama.cpp's keys, src/llama-model.cpp and models/qwen*moe.cpp,
/// llama.cpp): expert_count, expert_used_count and the sizes `m` says; every layer sparse (GGUF
/// has no dense layer list).
void read_moe_gguf(GgufKeys& k, CausalLMConfig& c, const MoeGguf& m);

/// llama.cpp's names of Mixtral, written as a "llama" file (convert_hf_to_gguf.py's LlamaModel):
/// the rope decoder's, block_sparse_moe.gate as ffn_gate_inp.weight, the experts' w1, w3, w2
/// stacked as ffn_{gate,up,down}_exps.weight.
const GgufNames& mixtral_gguf();

/// The same for experts saved fused, as gpt-oss's are (transformers 5.23.0
/// models/gpt_oss/modeling_gpt_oss.py GptOssExperts, GptOssTopKRouter): mlp.router.{weight,
/// bias}, mlp.experts.gate_up_proj [experts, hidden, 2 x intermediate] with the gate in the
/// even columns and up in the odd ones, its bias [experts, 2 x intermediate] alike,
/// mlp.experts.down_proj [experts, intermediate, hidden] and its bias [experts, hidden].
WeightMap fused_experts_weight_map(const CausalLMConfig& c);

/// The same model over llama.cpp's layout of a gpt-oss file (conversion/gpt_oss.py
/// GptOssModel): each expert's gate, up and down rows [out, in] and biases as
/// model.layers.N.mlp.experts.E.{gate,up,down}_proj.{weight,bias}, which fused_experts_gguf()
/// names ffn_{gate,up,down}_exps.{weight,bias} [experts, ...], so that quantized experts can be
/// held in their blocks.
WeightMap fused_experts_gguf_weight_map(const CausalLMConfig& c);

/// llama.cpp's names of a gpt-oss file (gguf-py MODEL_ARCH.GPT_OSS's tensors): the rope
/// decoder's with post_attention_layernorm as post_attention_norm, self_attn.sinks as
/// attn_sinks.weight, the router mlp.router.{weight,bias} as ffn_gate_inp.{weight,bias}, and the
/// experts of fused_experts_gguf_weight_map.
const GgufNames& fused_experts_gguf();

}  // namespace te::hf::detail
