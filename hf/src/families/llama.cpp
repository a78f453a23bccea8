// Llama (2, 3, SmolLM2): transformers' LlamaForCausalLM. Optional q/k/v/o biases
// (attention_bias) and MLP biases (mlp_bias); no sliding window (sliding_window and layer_types
// are unread, so refused). In GGUF ("llama"), llama.cpp's converter interleaves each head's
// query and key rows (convert_hf_to_gguf.py LlamaModel.permute; transformers 5.23.0
// modeling_gguf_pytorch_utils.py LlamaTensorProcessor undoes it).

#include "rope_decoder.h"

namespace te::hf::detail {

namespace {

void read_config(Fields& f, CausalLMConfig& c) {
  read_rope_decoder_config(f, c);
  c.attention_bias = f.boolean_or("attention_bias", false);
  c.qkv_bias = c.attention_bias;
  c.mlp_bias = f.boolean_or("mlp_bias", false);
}

// A dense file may say expert_count 0 (llama.cpp's llama-model-saver writes it; with experts
// the file is Mixtral's: Family::gguf_experts_of).
void read_gguf_config(GgufKeys& k, CausalLMConfig&) {
  for (const char* key : {"expert_count", "expert_used_count"}) {
    if (k.integer(key).value_or(0) != 0) k.fail(key, "is not 0 in a dense Llama file");
  }
}

}  // namespace

const Family& llama_family() {
  static const Family kFamily = [] {
    Family f = rope_decoder_family({"llama", "LlamaForCausalLM", "llama", "Llama (2, 3, SmolLM2)"},
                                   read_config, /*interleaved_qk=*/true);
    f.read_gguf_config = read_gguf_config;
    return f;
  }();
  return kFamily;
}

}  // namespace te::hf::detail
