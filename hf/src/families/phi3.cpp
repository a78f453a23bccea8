// Phi-3 and Phi-3.5: transformers' Phi3ForCausalLM (models/phi3/, 5.23.0). Llama's decoder with
// the query, key and value projections fused into one qkv_proj and the MLP's gate and up into
// one gate_up_proj (their rows in that order), no biases, dropout on each block's output
// (resid_pdrop) and none on the embeddings (embd_pdrop is unused), an optional sliding_window
// on every layer (the mask of create_sliding_window_causal_mask, eager attention included),
// partial_rotary_factor, and RoPE default or longrope (rope_type "yarn" meaning longrope, the
// original length the top-level original_max_position_embeddings). Phi3Config's defaults where
// config.json is silent: rms_norm_eps 1e-5, max_position_embeddings and
// original_max_position_embeddings 4096, pad_token_id 32000. GGUF: "phi3", the fused tensors
// as attn_qkv and ffn_up (convert_hf_to_gguf.py Phi3MiniModel), LongRoPE's factors as
// rope_factors_long/short.weight.

#include <algorithm>

#include "rope_decoder.h"

namespace te::hf::detail {

namespace {

constexpr int64_t kDefaultPad = 32000;  // Phi3Config's pad_token_id

void read_config(Fields& f, CausalLMConfig& c) {
  DecoderDefaults rules;
  rules.max_position_embeddings = 4096;
  rules.rms_norm_eps = 1e-5;
  rules.rope.types = {"default", "longrope"};
  rules.rope.yarn_is_longrope = true;
  rules.rope.original_max_position_embeddings =
      f.integer_or("original_max_position_embeddings", 4096);
  read_rope_decoder_config(f, c, rules);
  // Phi3Attention's head_dim is getattr(config, "head_dim", hidden_size // heads) while the
  // config's RoPE checks take hidden_size // heads; only where they agree is it one model.
  if (f.contains("head_dim") && c.head_dim * c.num_attention_heads != c.hidden_size) {
    f.fail("head_dim",
           "is not hidden_size / num_attention_heads, which Phi3Config sizes its RoPE "
           "by; te-cpp builds Phi-3 with that head size only");
  }
  c.hidden_dropout = f.number_or("resid_pdrop", 0.0);
  if (!f.contains("pad_token_id")) {
    if (c.vocab_size <= kDefaultPad) {
      f.fail("pad_token_id", "is absent, and Phi3Config's default " + std::to_string(kDefaultPad) +
                                 " is not a row of the " + std::to_string(c.vocab_size) +
                                 "-token vocabulary (transformers cannot build that model "
                                 "either); give pad_token_id (null: none)");
    }
    c.pad_token_id = kDefaultPad;
  }
  std::optional<int64_t> window;
  if (f.has("sliding_window")) window = f.integer("sliding_window");
  for (auto& w : c.layer_windows) w = window;
}

// rope_decoder's map with q_kernel and kv_kernel taken from qkv_proj's rows [q | k | v] and
// wi_kernel's gate and up slots from gate_up_proj's rows [gate | up]: each slot a narrowed part
// of the fused tensor, so each rank reads the rows of its own heads and columns.
WeightMap weight_map(const CausalLMConfig& c) {
  WeightMap m = rope_decoder_weight_map(c);
  const int64_t q = c.num_attention_heads * c.head_dim, kv = c.num_key_value_heads * c.head_dim;
  const int64_t qkv = q + 2 * kv, ff = c.intermediate_size;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string te = "layers." + std::to_string(i) + ".";
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    const std::string fused = hf + "self_attn.qkv_proj.weight", up = hf + "mlp.gate_up_proj.weight";
    m[te + "self_attention.q_kernel"] = {{fused, -1, 0, true, 0, 0, q, qkv}};
    m[te + "self_attention.kv_kernel"] = {{fused, 1, 0, true, 0, q, kv, qkv},
                                          {fused, 1, 1, true, 0, q + kv, kv, qkv}};
    m[te + "mlp.wi_kernel"] = {{up, 1, 0, true, 0, 0, ff, 2 * ff},
                               {up, 1, 1, true, 0, ff, ff, 2 * ff}};
  }
  return m;
}

// llama.cpp's names: Llama's, with the fused tensors.
const GgufNames& gguf_names() {
  static const GgufNames kNames = [] {
    GgufNames n = kRopeDecoderGguf;
    auto& layer = n.layer;  // ffn_up is gate_up_proj here, not up_proj
    layer.erase(std::remove_if(layer.begin(), layer.end(),
                               [](const auto& p) { return p.second == "ffn_up.weight"; }),
                layer.end());
    n.layer.push_back({"self_attn.qkv_proj.weight", "attn_qkv.weight"});
    n.layer.push_back({"mlp.gate_up_proj.weight", "ffn_up.weight"});
    return n;
  }();
  return kNames;
}

}  // namespace

const Family& phi3_family() {
  static const Family kFamily = [] {
    Family f = rope_decoder_family({"phi3", "Phi3ForCausalLM", "phi3", "Phi-3 (3.5)"}, read_config);
    f.weight_map = weight_map;
    f.metadata = {"embd_pdrop"};  // Phi3Model applies no embedding dropout
    f.gguf = &gguf_names();
    f.gguf_ignores_sliding_window = true;
    return f;
  }();
  return kFamily;
}

}  // namespace te::hf::detail
