// Mixtral: transformers' MixtralForCausalLM. Mistral's attention (sliding_window on every layer,
// none when null or absent: MixtralConfig's default is None) with every MLP sparse:
// num_local_experts experts of intermediate_size (w1 gate, w3 up, w2 down), the top
// num_experts_per_tok of the softmax, always renormalised. From GGUF files too: llama.cpp's
// converter writes them as "llama" with llama.expert_count (its LlamaModel, q/k rows interleaved as
// Llama's).

#include "moe_decoder.h"

namespace te::hf::detail {

namespace {

void read_config(Fields& f, CausalLMConfig& c) {
  read_rope_decoder_config(f, c);
  std::optional<int64_t> window;
  if (f.has("sliding_window")) window = f.integer("sliding_window");
  for (auto& w : c.layer_windows) w = window;
  read_moe_config(f, c, {"num_local_experts", false, false});
  if (f.number_or("router_jitter_noise", 0.0) != 0.0) {
    f.fail("router_jitter_noise", "te-cpp's router adds no training-time noise; give 0");
  }
}

WeightMap weight_map(const CausalLMConfig& c) {
  return moe_decoder_weight_map(c, {"block_sparse_moe.", "w1", "w3", "w2"});
}

// llama.cpp's Mixtral graph (src/models/llama.cpp): experts of feed_forward_length, the chosen
// weights renormalised.
void read_gguf_config(GgufKeys& k, CausalLMConfig& c) {
  MoeGguf m;
  m.ffn_length = true;
  read_moe_gguf(k, c, m);
}

}  // namespace

const Family& mixtral_family() {
  static const Family kFamily = [] {
    Family f = rope_decoder_family({"mixtral", "MixtralForCausalLM", "", "Mixtral"}, read_config);
    f.weight_map = weight_map;
    f.gguf = &mixtral_gguf();
    f.gguf_interleaved_qk = true;
    f.read_gguf_config = read_gguf_config;
    f.gguf_experts_of = "llama";
    return f;
  }();
  return kFamily;
}

}  // namespace te::hf::detail
