// Qwen2-MoE (Qwen1.5-MoE): transformers' Qwen2MoeForCausalLM. Qwen2's attention (q/k/v biases:
// qkv_bias, true when absent) with sparse MLPs as Qwen3-MoE's plus a shared expert of
// shared_expert_intermediate_size every token goes through, scaled by sigmoid(shared_expert_gate).
// From GGUF files too (llama.cpp's qwen2moe).

#include "moe_decoder.h"

namespace te::hf::detail {

namespace {

void read_config(Fields& f, CausalLMConfig& c) {
  read_rope_decoder_config(f, c);
  c.qkv_bias = f.boolean_or("qkv_bias", true);
  // Qwen2-MoE's default layer_types (every other layer below max_window_layers) is not Qwen2's
  // rule; transformers writes layer_types into every config it saves, and te-cpp reads those.
  if (f.boolean_or("use_sliding_window", false) && !f.has("layer_types")) {
    f.fail("use_sliding_window",
           "is true without layer_types; give the layers' types "
           "(transformers writes them when it saves a config)");
  }
  read_qwen_windows(f, c);
  read_moe_config(f, c, {"num_experts", true, true});
}

WeightMap weight_map(const CausalLMConfig& c) { return moe_decoder_weight_map(c, {}); }

void read_gguf_config(GgufKeys& k, CausalLMConfig& c) {
  read_moe_gguf(k, c, {/*renormalise=*/false, /*shared=*/true});
}

}  // namespace

const Family& qwen2_moe_family() {
  static const Family kFamily = [] {
    Family f = rope_decoder_family({"qwen2_moe", "Qwen2MoeForCausalLM", "qwen2moe", "Qwen2-MoE"},
                                   read_config);
    f.weight_map = weight_map;
    f.gguf = &experts_gguf();
    f.read_gguf_config = read_gguf_config;
    return f;
  }();
  return kFamily;
}

}  // namespace te::hf::detail
