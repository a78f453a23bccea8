// Qwen3-MoE: transformers' Qwen3MoeForCausalLM. Qwen3's attention (q/k norms, optional biases;
// use_sliding_window windows every layer) with sparse MLPs: num_experts experts of
// moe_intermediate_size, the top num_experts_per_tok of the softmax, renormalised with
// norm_topk_prob; decoder_sparse_step and mlp_only_layers pick the sparse layers (the others: a
// dense MLP of intermediate_size). From GGUF files too (llama.cpp's qwen3moe).

#include "moe_decoder.h"

namespace te::hf::detail {

namespace {

void read_config(Fields& f, CausalLMConfig& c) {
  read_qwen3_attention(f, c);
  // Qwen3-MoE's window is on every layer when on (Qwen3MoeConfig keeps sliding_window only with
  // use_sliding_window, 4096 when absent; Qwen3MoeAttention windows each layer by it:
  // transformers 5.23.0), unlike Qwen3's layer_types / max_window_layers.
  std::optional<int64_t> window = 4096;
  if (f.contains("sliding_window")) {
    window.reset();
    if (f.has("sliding_window")) window = f.integer("sliding_window");
  }
  if (!f.boolean_or("use_sliding_window", false)) window.reset();
  for (auto& w : c.layer_windows) w = window;
  read_moe_config(f, c, {"num_experts", true, false});
}

WeightMap weight_map(const CausalLMConfig& c) { return moe_decoder_weight_map(c, {}); }

void read_gguf_config(GgufKeys& k, CausalLMConfig& c) {
  read_moe_gguf(k, c, {/*renormalise=*/true, /*shared=*/false});
}

}  // namespace

const Family& qwen3_moe_family() {
  static const Family kFamily = [] {
    Family f = rope_decoder_family({"qwen3_moe", "Qwen3MoeForCausalLM", "qwen3moe", "Qwen3-MoE"},
                                   read_config);
    f.weight_map = weight_map;
    f.gguf = &experts_gguf();
    f.read_gguf_config = read_gguf_config;
    return f;
  }();
  return kFamily;
}

}  // namespace te::hf::detail
