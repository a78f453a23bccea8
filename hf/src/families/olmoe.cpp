// OLMoE: transformers' OlmoeForCausalLM (5.23.0 models/olmoe). Llama's decoder with optional
// q/k/v/o biases (attention_bias), RMSNorms of each token's whole query and whole key
// (q_norm [hidden_size], k_norm [kv heads x head_dim]: not per head), an optional clip_qkv on the
// queries, keys and values after them, and every MLP sparse: num_experts experts of
// intermediate_size, the top num_experts_per_tok of the softmax, renormalised when
// norm_topk_prob. Saved per expert (mlp.experts.N.*_proj, router mlp.gate), as Qwen2-MoE's.
// From GGUF files too (llama.cpp's olmoe).

#include <cmath>

#include "moe_decoder.h"

namespace te::hf::detail {

namespace {

void read_config(Fields& f, CausalLMConfig& c) {
  DecoderDefaults defaults;  // OlmoeConfig's
  defaults.max_position_embeddings = 4096;
  defaults.rms_norm_eps = 1e-5;
  defaults.pad_token_id = 1;
  read_rope_decoder_config(f, c, defaults);
  // OlmoeAttention sizes q_norm by hidden_size, which the queries fill only with heads of
  // hidden_size / num_attention_heads.
  if (c.head_dim * c.num_attention_heads != c.hidden_size) {
    f.fail("head_dim", std::to_string(c.head_dim) + " x " + std::to_string(c.num_attention_heads) +
                           " heads is not hidden_size " + std::to_string(c.hidden_size) +
                           ", which OLMoE's q_norm takes");
  }
  c.attention_bias = f.boolean_or("attention_bias", false);
  c.qkv_bias = c.attention_bias;
  c.qk_norm = true;
  c.qk_norm_over_heads = true;
  if (f.has("clip_qkv")) {
    c.clip_qkv = f.number_or("clip_qkv", 0.0);
    if (!(std::isfinite(c.clip_qkv) && c.clip_qkv > 0)) {
      f.fail("clip_qkv", "must be positive and finite, or null (none)");
    }
  }
  MoeFields experts;
  experts.qwen = false;
  experts.norm_topk_prob_field = true;
  experts.aux_loss_coef = 0.01;
  read_moe_config(f, c, experts);
}

WeightMap weight_map(const CausalLMConfig& c) { return moe_decoder_weight_map(c, {}); }

// llama.cpp's olmoe (conversion/olmo.py OlmoeModel, a TextModel: q/k rows as transformers'; its
// graph in src/models/olmoe.cpp at llama-cpp-python 0.3.36's vendored llama.cpp 0c1e570): the q/k
// norms over each token's whole query and key, no clip, experts of feed_forward_length, the chosen
// weights never renormalised (build_moe_ffn's norm_w false, as OLMoE-1B-7B's norm_topk_prob).
void read_gguf_config(GgufKeys& k, CausalLMConfig& c) {
  if (c.head_dim * c.num_attention_heads != c.hidden_size) {
    k.fail("attention.key_length",
           std::to_string(c.head_dim) + " x " + std::to_string(c.num_attention_heads) +
               " heads is not embedding_length " + std::to_string(c.hidden_size) +
               ", which OLMoE's q_norm takes");
  }
  if (!c.qk_norm) {
    k.fail("block_count", "the layers have no attn_q_norm / attn_k_norm, which OLMoE's have");
  }
  c.qk_norm_over_heads = true;
  MoeGguf m;
  m.renormalise = false;
  m.ffn_length = true;
  read_moe_gguf(k, c, m);
  c.router_aux_loss_coef = 0.01;  // OlmoeConfig's
}

}  // namespace

const Family& olmoe_family() {
  static const Family kFamily = [] {
    Family f = rope_decoder_family({"olmoe", "OlmoeForCausalLM", "olmoe", "OLMoE"}, read_config);
    f.weight_map = weight_map;
    f.gguf = &experts_gguf();
    f.read_gguf_config = read_gguf_config;
    return f;
  }();
  return kFamily;
}

}  // namespace te::hf::detail
