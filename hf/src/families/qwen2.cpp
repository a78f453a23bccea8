// Qwen2 (and Qwen2.5): transformers' Qwen2ForCausalLM. Biases on q/k/v and on nothing else
// (attention_bias true is refused); Qwen's sliding windows. GGUF: "qwen2", rows as in
// transformers.

#include "rope_decoder.h"

namespace te::hf::detail {

namespace {

void read_config(Fields& f, CausalLMConfig& c) {
  read_rope_decoder_config(f, c);
  if (f.boolean_or("attention_bias", false)) {
    f.fail("attention_bias", "Qwen2 has q/k/v biases and no other; true is not a Qwen2 layout");
  }
  c.qkv_bias = true;
  read_qwen_windows(f, c);
}

}  // namespace

const Family& qwen2_family() {
  static const Family kFamily =
      rope_decoder_family({"qwen2", "Qwen2ForCausalLM", "qwen2", "Qwen2"}, read_config);
  return kFamily;
}

}  // namespace te::hf::detail
