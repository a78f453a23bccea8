// Gemma 2: transformers' Gemma2ForCausalLM (5.23.0 models/gemma2/modeling_gemma2.py and
// configuration_gemma2.py): the Gemma decoder (gemma_decoder.h) with soft caps of 50 (attention)
// and 30 (head) unless the config says otherwise, every other layer sliding from layer 0 unless
// layer_types says otherwise. config.json's hidden_act is not Gemma2Config's field and
// transformers does not read it. GGUF ("gemma2"): llama.cpp's convert_hf_to_gguf.py
// (conversion/gemma.py Gemma2Model) writes the norms plus one and no output.weight (tied);
// transformers 5.23.0 reads the file's sizes and sliding_window over Gemma2Config's defaults
// (integrations/ggml.py GGUF_CONFIG_MAPPING["gemma2"]), so te-cpp does the same and refuses soft
// caps there other than those defaults.

#include "gemma_decoder.h"

namespace te::hf::detail {

namespace {

constexpr double kAttnSoftcap = 50.0, kFinalSoftcap = 30.0;  // Gemma2Config's defaults

void read_config(Fields& f, CausalLMConfig& c) {
  GemmaDefaults gemma;  // Gemma2Config's
  gemma.attn_logit_softcapping = kAttnSoftcap;
  gemma.final_logit_softcapping = kFinalSoftcap;
  gemma.sliding_window_pattern = 2;
  read_gemma_config(f, c, gemma);
}

// A GGUF file's Gemma 2: what transformers' GGUF config holds beyond the shared keys.
void read_gguf_config(GgufKeys& k, CausalLMConfig& c) {
  set_gemma_common(c);
  c.post_block_norms = true;
  c.mlp_activations = {"gelu", "linear"};
  c.attention_scale = 1.0 / 16;  // query_pre_attn_scalar's default 256: 256^-0.5
  refuse_gguf_rope_scaling(k, c);
  for (const auto& [key, want] :
       {std::pair<const char*, double>{"attn_logit_softcapping", kAttnSoftcap},
        {"final_logit_softcapping", kFinalSoftcap}}) {
    const double cap = k.number(key).value_or(want);
    if (cap != want) {
      k.fail(key, std::to_string(cap) + " is not Gemma2Config's " + std::to_string(want) +
                      ", which transformers' GGUF loader uses whatever the file says; te-cpp "
                      "refuses the file rather than differ");
    }
  }
  c.attn_logit_softcapping = kAttnSoftcap;
  c.final_logit_softcapping = kFinalSoftcap;
  const int64_t window = k.integer("attention.sliding_window").value_or(4096);
  for (std::size_t i = 0; i < c.layer_windows.size(); ++i) {
    if ((i + 1) % 2 != 0) c.layer_windows[i] = window;
  }
}

}  // namespace

const Family& gemma2_family() {
  static const Family kFamily = [] {
    Family f =
        rope_decoder_family({"gemma2", "Gemma2ForCausalLM", "gemma2", "Gemma 2"}, read_config);
    f.gguf = &kGemmaGguf;
    f.gguf_norms_plus_one = true;
    f.read_gguf_config = read_gguf_config;
    // hidden_act: Gemma2Config has no such field (hidden_activation is read); cache_implementation:
    // generate()'s cache choice.
    f.metadata = {"hidden_act", "cache_implementation"};
    return f;
  }();
  return kFamily;
}

}  // namespace te::hf::detail
