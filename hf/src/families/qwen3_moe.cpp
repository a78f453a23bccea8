// Qwen3-MoE: transformers' Qwen3MoeForCausalLM. Qwen3's attention (q/k norms, optional biases,
// Qwen's sliding windows) with sparse MLPs: num_experts experts of moe_intermediate_size, the top
// num_experts_per_tok of the softmax, renormalised with norm_topk_prob; decoder_sparse_step and
// mlp_only_layers pick the sparse layers (the others: a dense MLP of intermediate_size). te-cpp
// reads no GGUF file of it yet.

#include "moe_decoder.h"

namespace te::hf::detail {

namespace {

void read_config(Fields& f, CausalLMConfig& c) {
  read_rope_decoder_config(f, c);
  c.attention_bias = f.boolean_or("attention_bias", false);
  c.qkv_bias = c.attention_bias;
  c.qk_norm = true;
  read_qwen_windows(f, c);
  read_moe_config(f, c, {"num_experts", true, false});
}

WeightMap weight_map(const CausalLMConfig& c) { return moe_decoder_weight_map(c, {}); }

}  // namespace

const Family& qwen3_moe_family() {
  static const Family kFamily = [] {
    Family f =
        rope_decoder_family({"qwen3_moe", "Qwen3MoeForCausalLM", "", "Qwen3-MoE"}, read_config);
    f.weight_map = weight_map;
    return f;
  }();
  return kFamily;
}

}  // namespace te::hf::detail
