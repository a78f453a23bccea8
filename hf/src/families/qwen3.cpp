// Qwen3: transformers' Qwen3ForCausalLM. A per-head RMSNorm of queries and keys before RoPE
// (q_norm, k_norm); optional q/k/v/o biases (attention_bias); Qwen's sliding windows. GGUF:
// "qwen3", rows as in transformers.

#include "rope_decoder.h"

namespace te::hf::detail {

namespace {

void read_config(Fields& f, CausalLMConfig& c) {
  read_qwen3_attention(f, c);
  read_qwen_windows(f, c);
}

}  // namespace

const Family& qwen3_family() {
  static const Family kFamily =
      rope_decoder_family({"qwen3", "Qwen3ForCausalLM", "qwen3", "Qwen3"}, read_config);
  return kFamily;
}

}  // namespace te::hf::detail
