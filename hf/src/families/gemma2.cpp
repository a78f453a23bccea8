// Gemma 2: transformers' Gemma2ForCausalLM (5.23.0 models/gemma2/modeling_gemma2.py and
// configuration_gemma2.py): the Gemma decoder (gemma_decoder.h) with soft caps of 50 (attention)
// and 30 (head) unless the config says otherwise, every other layer sliding from layer 0 unless
// layer_types says otherwise. config.json's hidden_act is not Gemma2Config's field and
// transformers does not read it. te-cpp reads no GGUF file of it.

#include "gemma_decoder.h"

namespace te::hf::detail {

namespace {

void read_config(Fields& f, CausalLMConfig& c) {
  GemmaDefaults gemma;  // Gemma2Config's
  gemma.attn_logit_softcapping = 50.0;
  gemma.final_logit_softcapping = 30.0;
  gemma.sliding_window_pattern = 2;
  read_gemma_config(f, c, gemma);
}

}  // namespace

const Family& gemma2_family() {
  static const Family kFamily = [] {
    Family f = rope_decoder_family({"gemma2", "Gemma2ForCausalLM", "", "Gemma 2"}, read_config);
    // hidden_act: Gemma2Config has no such field (hidden_activation is read); cache_implementation:
    // generate()'s cache choice.
    f.metadata = {"hidden_act", "cache_implementation"};
    return f;
  }();
  return kFamily;
}

}  // namespace te::hf::detail
