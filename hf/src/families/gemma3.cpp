// Gemma 3 (text): transformers' Gemma3ForCausalLM, model_type gemma3_text (5.23.0
// models/gemma3/modeling_gemma3.py and configuration_gemma3.py): the Gemma decoder
// (gemma_decoder.h) with q/k RMSNorms (1 + weight) before RoPE, no head soft cap unless the
// config gives one (and no attention soft cap: Gemma3Attention never applies it), five sliding
// layers to one global (sliding_window_pattern, 6) unless layer_types says otherwise, and two
// RoPEs: the global layers' (rope_theta, 1e6 when absent; its scaling, linear for 4B+) and the
// sliding layers' own default one (rope_local_base_freq, 1e4 when absent; or rope_parameters'
// full_attention and sliding_attention). GGUF ("gemma3"): llama.cpp's converter
// (conversion/gemma.py Gemma3Model) writes the norms plus one; transformers 5.23.0 reads the file's
// sizes, rope.freq_base and sliding_window over Gemma3TextConfig's defaults (integrations/ggml.py
// GGUF_CONFIG_MAPPING["gemma3"]), so te-cpp does the same and refuses what transformers would
// ignore there (a head soft cap, RoPE scaling, a sliding base rope.freq_base_swa other than 1e4).

#include "gemma_decoder.h"

namespace te::hf::detail {

namespace {

void read_config(Fields& f, CausalLMConfig& c) {
  GemmaDefaults gemma;  // Gemma3TextConfig's
  gemma.sliding_window_pattern = f.integer_or("sliding_window_pattern", 6);
  if (gemma.sliding_window_pattern <= 0) {
    f.fail("sliding_window_pattern", "must be positive");
  }
  gemma.qk_norm = true;
  gemma.rope_per_layer_type = true;
  gemma.applies_attn_softcap = false;
  gemma.rope_theta = 1e6;
  gemma.max_position_embeddings = 131072;
  read_gemma_config(f, c, gemma);
  // The sliding layers' base: rope_parameters.sliding_attention's, else rope_local_base_freq.
  if (f.has("rope_local_base_freq")) {
    const double local = f.number_or("rope_local_base_freq", 0);
    if (c.sliding_rope_theta > 0 && c.sliding_rope_theta != local) {
      f.fail("rope_local_base_freq",
             "differs from rope_parameters.sliding_attention.rope_theta; give it once");
    }
    c.sliding_rope_theta = local;
  }
  if (c.sliding_rope_theta == 0) c.sliding_rope_theta = 10000.0;
}

// A GGUF file's Gemma 3: what transformers' GGUF config holds beyond the shared keys.
void read_gguf_config(GgufKeys& k, CausalLMConfig& c) {
  set_gemma_common(c);
  c.post_block_norms = true;
  c.qk_norm = true;
  c.mlp_activations = {"gelu", "linear"};
  c.attention_scale = 1.0 / 16;  // query_pre_attn_scalar's default 256: 256^-0.5
  if (!k.number("rope.freq_base")) c.rope_theta = 1e6;  // Gemma3TextConfig's global base
  c.sliding_rope_theta = 10000.0;                       // and its sliding one
  // llama.cpp's converter writes the sliding base too (conversion/base.py
  // TextModel.set_gguf_parameters: rope_parameters' sliding_attention, or config.json's
  // rope_local_base_freq, as rope.freq_base_swa), which transformers' GGUF loader does not read.
  if (const auto swa = k.number("rope.freq_base_swa"); swa && *swa != c.sliding_rope_theta) {
    k.fail("rope.freq_base_swa",
           std::to_string(*swa) +
               " is not Gemma3TextConfig's sliding base 10000, which "
               "transformers' GGUF loader uses whatever the file says; te-cpp refuses the file "
               "rather than differ");
  }
  refuse_gguf_rope_scaling(k, c);
  if (const auto cap = k.number("final_logit_softcapping")) {
    k.fail("final_logit_softcapping",
           "transformers' GGUF loader does not read it for gemma3 (no "
           "cap); te-cpp refuses the file rather than differ");
  }
  const int64_t window = k.integer("attention.sliding_window").value_or(4096);
  for (std::size_t i = 0; i < c.layer_windows.size(); ++i) {
    if ((i + 1) % 6 != 0) c.layer_windows[i] = window;  // sliding_window_pattern's default 6
  }
}

}  // namespace

const Family& gemma3_family() {
  static const Family kFamily = [] {
    Family f =
        rope_decoder_family({"gemma3_text", "Gemma3ForCausalLM", "gemma3", "Gemma 3"}, read_config);
    f.gguf = &kGemmaGguf;
    f.gguf_norms_plus_one = true;
    f.read_gguf_config = read_gguf_config;
    // _sliding_window_pattern: what save_pretrained writes beside layer_types, which transformers
    // does not read back (it reads sliding_window_pattern); hidden_act: not Gemma3TextConfig's
    // field (hidden_activation is read); cache_implementation: generate()'s.
    f.metadata = {"_sliding_window_pattern", "hidden_act", "cache_implementation"};
    return f;
  }();
  return kFamily;
}

}  // namespace te::hf::detail
