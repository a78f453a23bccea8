// Gemma (1): transformers' GemmaForCausalLM (5.23.0 models/gemma/modeling_gemma.py and
// configuration_gemma.py): the RoPE decoder with Gemma's RMSNorms (1 + weight), embeddings times
// sqrt(hidden_size) and a GeGLU MLP (hidden_act gelu_pytorch_tanh; "gelu", the official
// releases' value, read as it too, as GemmaConfig does); head_dim 256 when absent; logits scaled
// by head_dim^-0.5; no sliding window, no soft cap, no norms after the blocks. config.json's
// hidden_activation (older configs' field) is not GemmaConfig's and transformers does not read
// it. te-cpp reads no GGUF file of it.

#include "gemma_decoder.h"

namespace te::hf::detail {

namespace {

void read_config(Fields& f, CausalLMConfig& c) {
  DecoderDefaults defaults;  // GemmaConfig's
  defaults.activation = "gelu_pytorch_tanh";
  defaults.gelu_means_tanh = true;
  defaults.head_dim = 256;
  defaults.tie_word_embeddings = true;
  defaults.pad_token_id = 0;
  defaults.max_position_embeddings = 8192;
  read_rope_decoder_config(f, c, defaults);
  if (c.rotary_dim != c.head_dim) {
    f.fail("partial_rotary_factor", "Gemma's rotary embedding rotates whole heads; te-cpp takes 1");
  }
  read_gemma_common(f, c);
}

}  // namespace

const Family& gemma_family() {
  static const Family kFamily = [] {
    Family f = rope_decoder_family({"gemma", "GemmaForCausalLM", "", "Gemma"}, read_config);
    f.metadata = {"hidden_activation", "cache_implementation"};
    return f;
  }();
  return kFamily;
}

}  // namespace te::hf::detail
