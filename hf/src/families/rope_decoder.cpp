// The shared decoder of the Llama-like families: config.json's shared fields, the weight map
// and llama.cpp's names (see rope_decoder.h).

#include "rope_decoder.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace te::hf::detail {

void read_rope_decoder_config(Fields& f, CausalLMConfig& c, const DecoderDefaults& defaults) {
  c.vocab_size = f.integer("vocab_size");
  c.hidden_size = f.integer("hidden_size");
  c.intermediate_size = f.integer("intermediate_size");
  c.num_hidden_layers = f.integer("num_hidden_layers");
  c.num_attention_heads = f.integer("num_attention_heads");
  c.num_key_value_heads = f.integer_or("num_key_value_heads", c.num_attention_heads);
  c.head_dim = f.integer_or("head_dim", defaults.head_dim);
  if (c.head_dim == 0 && !f.has("head_dim") && c.num_attention_heads > 0) {
    if (c.hidden_size % c.num_attention_heads != 0) {
      f.fail("hidden_size", "is not a multiple of num_attention_heads and there is no head_dim");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.max_position_embeddings =
      f.integer_or("max_position_embeddings", defaults.max_position_embeddings);
  c.rms_norm_eps = f.number_or("rms_norm_eps", defaults.rms_norm_eps);
  // The gated MLP act(x W_gate) * x W_up: silu (SwiGLU) or the tanh gelu (GeGLU, te's "gelu").
  if (defaults.activation_field != nullptr) {
    std::string act = f.string_or(defaults.activation_field, defaults.activation);
    if (act == "gelu" && defaults.gelu_means_tanh) act = "gelu_pytorch_tanh";
    if (act == "silu") {
      c.mlp_activations = {"silu", "linear"};
    } else if (act == "gelu_pytorch_tanh") {
      c.mlp_activations = {"gelu", "linear"};
    } else {
      f.fail(defaults.activation_field,
             "'" + act + "': te-cpp builds this family's gated MLP with silu or gelu_pytorch_tanh");
    }
  }
  if (f.integer_or("pretraining_tp", 1) != 1) {
    f.fail("pretraining_tp", "slices the projections at training time only; te-cpp supports 1");
  }
  c.attention_dropout = f.number_or("attention_dropout", 0.0);
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", defaults.tie_word_embeddings);
  if (f.has("pad_token_id")) {
    c.pad_token_id = f.integer("pad_token_id");
  } else if (!f.contains("pad_token_id")) {  // absent, not null
    c.pad_token_id = defaults.pad_token_id;
  }
  read_rope(f, c, defaults.rope);
  if (c.num_hidden_layers <= 0 || c.num_hidden_layers > 65536) {
    f.fail("num_hidden_layers",
           std::to_string(c.num_hidden_layers) + " is not in [1, 65536], the layers te-cpp builds");
  }
  c.layer_windows.assign(static_cast<std::size_t>(c.num_hidden_layers), std::nullopt);
}

void read_qwen3_attention(Fields& f, CausalLMConfig& c) {
  read_rope_decoder_config(f, c);
  c.attention_bias = f.boolean_or("attention_bias", false);
  c.qkv_bias = c.attention_bias;
  c.qk_norm = true;
}

void read_qwen_windows(Fields& f, CausalLMConfig& c) {
  std::optional<int64_t> window;
  const bool absent = !f.contains("sliding_window");
  if (f.has("sliding_window")) window = f.integer("sliding_window");
  if (absent) window = 4096;  // transformers' default for Qwen2 and Qwen3
  if (!f.boolean_or("use_sliding_window", false)) window.reset();
  const int64_t first = f.integer_or("max_window_layers", 28);  // (superseded by layer_types)
  if (f.has("layer_types")) {
    const json& types = f.raw("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c.num_hidden_layers) {
      f.fail("layer_types", "expected a list of num_hidden_layers entries, got " + types.dump());
    }
    for (std::size_t i = 0; i < types.size(); ++i) {
      if (types[i] == "sliding_attention") {
        if (!window) f.fail("layer_types", "names a sliding_attention layer but no window is on");
        c.layer_windows[i] = window;
      } else if (types[i] != "full_attention") {
        f.fail("layer_types",
               "entry " + types[i].dump() + " is not full_attention or sliding_attention");
      }
    }
  } else if (window) {
    for (int64_t i = std::max<int64_t>(first, 0); i < c.num_hidden_layers; ++i) {
      c.layer_windows[static_cast<std::size_t>(i)] = window;
    }
  }
}

void read_alternating_windows(Fields& f, CausalLMConfig& c, int64_t pattern,
                              int64_t default_window) {
  std::optional<int64_t> window = default_window;
  if (f.contains("sliding_window")) {
    window.reset();
    if (f.has("sliding_window")) window = f.integer("sliding_window");
  }
  std::vector<bool> sliding;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) sliding.push_back((i + 1) % pattern != 0);
  if (f.has("layer_types")) {
    const json& types = f.raw("layer_types");
    if (!types.is_array() || static_cast<int64_t>(types.size()) != c.num_hidden_layers) {
      f.fail("layer_types", "expected a list of num_hidden_layers entries, got " + types.dump());
    }
    for (std::size_t i = 0; i < types.size(); ++i) {
      if (types[i] != "full_attention" && types[i] != "sliding_attention") {
        f.fail("layer_types",
               "entry " + types[i].dump() + " is not full_attention or sliding_attention");
      }
      sliding[i] = types[i] == "sliding_attention";
    }
  }
  for (std::size_t i = 0; i < sliding.size(); ++i) {
    if (!sliding[i]) continue;
    if (!window) f.fail("sliding_window", "is null but layer " + std::to_string(i) + " slides");
    c.layer_windows[i] = window;
  }
}

WeightMap rope_decoder_weight_map(const CausalLMConfig& c) {
  WeightMap m;
  auto whole = [&](const std::string& te, const std::string& hf) { m[te] = {{hf}}; };
  auto kernel = [&](const std::string& te, const std::string& hf) {
    m[te] = {{hf, -1, 0, /*transpose=*/true}};
  };
  // A stacked kernel [in, 2, out] (slots on dim 1) and its bias [2, out] (slots on dim 0).
  auto pair = [&](const std::string& te, const std::string& a, const std::string& b, bool bias) {
    m[te] = {{a, bias ? 0 : 1, 0, !bias}, {b, bias ? 0 : 1, 1, !bias}};
  };
  whole("embed.embedding", "model.embed_tokens.weight");
  whole("norm.scale", "model.norm.weight");
  if (!c.tie_word_embeddings) kernel("lm_head.kernel", "lm_head.weight");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string te = "layers." + std::to_string(i) + ".";
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    const std::string attn = hf + "self_attn.", mlp = hf + "mlp.";
    whole(te + "self_attention.layernorm.scale", hf + "input_layernorm.weight");
    kernel(te + "self_attention.q_kernel", attn + "q_proj.weight");
    pair(te + "self_attention.kv_kernel", attn + "k_proj.weight", attn + "v_proj.weight", false);
    kernel(te + "self_attention.out_kernel", attn + "o_proj.weight");
    if (c.qkv_bias) {
      whole(te + "self_attention.q_bias", attn + "q_proj.bias");
      pair(te + "self_attention.kv_bias", attn + "k_proj.bias", attn + "v_proj.bias", true);
    }
    if (c.attention_bias) whole(te + "self_attention.out_bias", attn + "o_proj.bias");
    if (c.attention_sinks) whole(te + "self_attention.attention.softmax_offset", attn + "sinks");
    if (c.qk_norm) {
      whole(te + "self_attention.q_norm.scale", attn + "q_norm.weight");
      whole(te + "self_attention.k_norm.scale", attn + "k_norm.weight");
    }
    if (c.post_block_norms) {  // Gemma 2's and 3's four norms (Gemma2DecoderLayer)
      whole(te + "post_attention_layernorm.scale", hf + "post_attention_layernorm.weight");
      whole(te + "mlp.layernorm.scale", hf + "pre_feedforward_layernorm.weight");
      whole(te + "post_mlp_layernorm.scale", hf + "post_feedforward_layernorm.weight");
    } else {
      whole(te + "mlp.layernorm.scale", hf + "post_attention_layernorm.weight");
    }
    pair(te + "mlp.wi_kernel", mlp + "gate_proj.weight", mlp + "up_proj.weight", false);
    kernel(te + "mlp.wo_kernel", mlp + "down_proj.weight");
    if (c.mlp_bias) {
      pair(te + "mlp.wi_bias", mlp + "gate_proj.bias", mlp + "up_proj.bias", true);
      whole(te + "mlp.wo_bias", mlp + "down_proj.bias");
    }
  }
  return m;
}

bool rope_decoder_derived(const std::string& name, const std::string& /*prefix*/) {
  return name.find("rotary_emb.inv_freq") != std::string::npos;
}

Family rope_decoder_family(FamilyInfo info, void (*read_config)(Fields&, CausalLMConfig&),
                           bool interleaved_qk) {
  Family f;
  f.info = std::move(info);
  f.read_config = read_config;
  f.weight_map = rope_decoder_weight_map;
  f.derived = rope_decoder_derived;
  if (!f.info.gguf_architecture.empty()) f.gguf = &kRopeDecoderGguf;
  f.gguf_interleaved_qk = interleaved_qk;
  return f;
}

const GgufNames kRopeDecoderGguf = {{{"model.embed_tokens.weight", "token_embd.weight"},
                                     {"model.norm.weight", "output_norm.weight"},
                                     {"lm_head.weight", "output.weight"}},
                                    {{"input_layernorm.weight", "attn_norm.weight"},
                                     {"self_attn.q_proj.weight", "attn_q.weight"},
                                     {"self_attn.k_proj.weight", "attn_k.weight"},
                                     {"self_attn.v_proj.weight", "attn_v.weight"},
                                     {"self_attn.o_proj.weight", "attn_output.weight"},
                                     {"self_attn.q_proj.bias", "attn_q.bias"},
                                     {"self_attn.k_proj.bias", "attn_k.bias"},
                                     {"self_attn.v_proj.bias", "attn_v.bias"},
                                     {"self_attn.o_proj.bias", "attn_output.bias"},
                                     {"self_attn.q_norm.weight", "attn_q_norm.weight"},
                                     {"self_attn.k_norm.weight", "attn_k_norm.weight"},
                                     {"post_attention_layernorm.weight", "ffn_norm.weight"},
                                     {"mlp.gate_proj.weight", "ffn_gate.weight"},
                                     {"mlp.up_proj.weight", "ffn_up.weight"},
                                     {"mlp.down_proj.weight", "ffn_down.weight"},
                                     {"mlp.gate_proj.bias", "ffn_gate.bias"},
                                     {"mlp.up_proj.bias", "ffn_up.bias"},
                                     {"mlp.down_proj.bias", "ffn_down.bias"}}};

}  // namespace te::hf::detail
