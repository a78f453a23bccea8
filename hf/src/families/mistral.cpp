// Mistral: transformers' MistralForCausalLM. No biases (attention_bias and mlp_bias are unread,
// so refused); sliding_window on every layer (4096 when absent, none when null). te-cpp reads no
// GGUF file of it.

#include "rope_decoder.h"

namespace te::hf::detail {

namespace {

void read_config(Fields& f, CausalLMConfig& c) {
  read_rope_decoder_config(f, c);
  std::optional<int64_t> window = 4096;  // transformers' MistralConfig default
  if (f.contains("sliding_window")) {
    window.reset();
    if (f.has("sliding_window")) window = f.integer("sliding_window");
  }
  for (auto& w : c.layer_windows) w = window;
}

}  // namespace

const Family& mistral_family() {
  static const Family kFamily =
      rope_decoder_family({"mistral", "MistralForCausalLM", "", "Mistral"}, read_config);
  return kFamily;
}

}  // namespace te::hf::detail
