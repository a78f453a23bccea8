// The shared decoder of the Llama-like families: config.json's shared fields, the weight map
// and llama.cpp's names (see rope_decoder.h).

#include "rope_decoder.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

namespace te::hf::detail {

namespace {

// A value given in two places must be given once or the same in both.
template <typename T>
void settle(std::optional<T>& have, const std::optional<T>& also, const std::string& what,
            const Fields& f) {
  if (!also) return;
  if (have && !(*have == *also)) {
    f.fail(what, "is given twice with different values; give it once");
  }
  have = also;
}

// Llama 3's RoPE scaling parameters (rope_type "llama3").
struct Llama3Rope {
  std::optional<double> low_freq_factor, high_freq_factor, original_max_position_embeddings;
};

// transformers' _compute_llama3_parameters (modeling_rope_utils.py, 5.23.0) as factors that
// divide each inverse frequency, the form llama.cpp's convert_hf_to_gguf.py writes into
// rope_freqs.weight: a wavelength 2 pi / inv_freq shorter than original / high_freq_factor keeps
// its frequency (1), one longer than original / low_freq_factor is divided by the factor, and
// the ones between take 1 / ((1 - s) / factor + s), s = (original / wavelength - low) / (high -
// low).
std::vector<double> llama3_frequency_factors(const CausalLMConfig& c, const Llama3Rope& r) {
  const double low = *r.low_freq_factor, high = *r.high_freq_factor;
  const double original = *r.original_max_position_embeddings;
  const int64_t dim = c.rotary_dim;
  std::vector<double> factors;
  for (int64_t i = 0; i < dim; i += 2) {
    const double inv_freq = 1.0 / std::pow(c.rope_theta, static_cast<double>(i) / dim);
    const double wavelength = 2 * std::acos(-1.0) / inv_freq;
    if (wavelength < original / high) {
      factors.push_back(1.0);
    } else if (wavelength > original / low) {
      factors.push_back(c.rope_factor);
    } else {
      const double s = (original / wavelength - low) / (high - low);
      factors.push_back(1.0 / ((1 - s) / c.rope_factor + s));
    }
  }
  return factors;
}

// The RoPE type's own parameters: linear's factor; llama3's factor, low/high_freq_factor and
// original_max_position_embeddings (each required, low < high); default takes none.
void read_rope_scaling(Fields& f, CausalLMConfig& c, const std::optional<double>& factor,
                       const Llama3Rope& llama3) {
  const bool llama3_given =
      llama3.low_freq_factor || llama3.high_freq_factor || llama3.original_max_position_embeddings;
  if (c.rope_type == "llama3") {
    if (!factor || !llama3.low_freq_factor || !llama3.high_freq_factor ||
        !llama3.original_max_position_embeddings) {
      f.fail("rope_parameters",
             "llama3 RoPE scaling needs factor, low_freq_factor, "
             "high_freq_factor and original_max_position_embeddings");
    }
    if (!(*llama3.low_freq_factor > 0 &&
          *llama3.low_freq_factor<*llama3.high_freq_factor&& *
                                  llama3.original_max_position_embeddings> 0)) {
      f.fail("rope_parameters",
             "llama3 RoPE scaling needs 0 < low_freq_factor < "
             "high_freq_factor and a positive original_max_position_embeddings");
    }
    c.rope_factor = *factor;
    return;
  }
  if (llama3_given) {
    f.fail("rope_parameters",
           "low_freq_factor, high_freq_factor and "
           "original_max_position_embeddings are llama3 RoPE scaling's; this "
           "config's RoPE type is '" +
               c.rope_type + "'");
  }
  if (c.rope_type == "linear") {
    if (!factor) f.fail("rope_parameters", "linear RoPE scaling needs a factor");
    c.rope_factor = *factor;
  } else if (c.rope_type != "default") {
    f.fail("rope_parameters.rope_type", "'" + c.rope_type +
                                            "' RoPE scaling is not supported by te-cpp (it "
                                            "supports 'default', 'linear' and 'llama3')");
  } else if (factor) {
    f.fail("rope_parameters.factor", "is given for RoPE type 'default', which takes none");
  }
}

// transformers 5's per-layer-type RoPE (5.23.0 models/gemma3/configuration_gemma3.py
// Gemma3TextConfig.convert_rope_params_to_dict): the sliding layers' base (a default RoPE) into
// c.sliding_rope_theta when given; returns the full-attention layers' object, the RoPE proper.
const json& per_layer_type_rope(const json& r, const Fields& f, CausalLMConfig& c) {
  static const json kNone = json::object();
  for (auto it = r.begin(); it != r.end(); ++it) {
    if ((it.key() != "full_attention" && it.key() != "sliding_attention") ||
        !it.value().is_object()) {
      f.fail("rope_parameters." + it.key(),
             "expected full_attention and sliding_attention objects (transformers' per-layer-type "
             "form), got " +
                 it.value().dump());
    }
  }
  if (r.contains("sliding_attention")) {
    Fields sliding(r.at("sliding_attention"), f.path(), "rope_parameters.sliding_attention.");
    const std::string type = sliding.string_or("rope_type", "default");
    if (type != "default") {
      sliding.fail("rope_type", "'" + type + "': te-cpp rotates sliding layers with default RoPE");
    }
    if (sliding.has("rope_theta")) c.sliding_rope_theta = sliding.number_or("rope_theta", 0);
    sliding.refuse_unread({});
  }
  return r.contains("full_attention") ? r.at("full_attention") : kNone;
}

// RoPE: transformers 5's rope_parameters, or the older rope_theta and rope_scaling (where
// transformers 4 saved both "type" and "rope_type"). A value may appear at the top level and
// inside the object only if both agree.
void read_rope(Fields& f, CausalLMConfig& c, double& partial, Llama3Rope& llama3,
               const DecoderDefaults& defaults) {
  std::optional<double> theta, factor, part;
  std::optional<std::string> type;
  if (f.has("rope_theta")) theta = f.number_or("rope_theta", 0);
  if (f.has("partial_rotary_factor")) part = f.number_or("partial_rotary_factor", 0);
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!f.has(key)) continue;
    const json& r = f.raw(key);
    if (!r.is_object()) f.fail(key, "expected an object, got " + r.dump());
    const bool per_type = defaults.rope_per_layer_type && std::string(key) == "rope_parameters";
    Fields rope(per_type ? per_layer_type_rope(r, f, c) : r, f.path(),
                per_type ? "rope_parameters.full_attention." : std::string(key) + ".");
    for (const char* name : {"rope_type", "type"}) {
      if (rope.has(name))
        settle(type, std::optional<std::string>(rope.string_or(name, "")),
               std::string(key) + "." + name, rope);
    }
    if (rope.has("rope_theta")) {
      settle(theta, std::optional<double>(rope.number_or("rope_theta", 0)), "rope_theta", rope);
    }
    if (rope.has("partial_rotary_factor")) {
      settle(part, std::optional<double>(rope.number_or("partial_rotary_factor", 0)),
             "partial_rotary_factor", rope);
    }
    if (rope.has("factor")) {
      settle(factor, std::optional<double>(rope.number_or("factor", 0)), "factor", rope);
    }
    for (auto [name, value] :
         {std::pair{"low_freq_factor", &llama3.low_freq_factor},
          {"high_freq_factor", &llama3.high_freq_factor},
          {"original_max_position_embeddings", &llama3.original_max_position_embeddings}}) {
      if (rope.has(name))
        settle(*value, std::optional<double>(rope.number_or(name, 0)), name, rope);
    }
    rope.refuse_unread({});
  }
  c.rope_type = type.value_or("default");
  read_rope_scaling(f, c, factor, llama3);
  c.rope_theta = theta.value_or(defaults.rope_theta);
  partial = part.value_or(1.0);
}

}  // namespace

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
  c.max_position_embeddings = f.integer_or("max_position_embeddings", 0);
  c.rms_norm_eps = f.number_or("rms_norm_eps", 1e-6);
  // The gated MLP act(x W_gate) * x W_up: silu (SwiGLU) or the tanh gelu (GeGLU, te's "gelu").
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
  double partial = 1.0;
  Llama3Rope llama3;
  read_rope(f, c, partial, llama3, defaults);
  if (!(partial > 0 && partial <= 1)) f.fail("partial_rotary_factor", "must be in (0, 1]");
  // transformers: int(head_dim * partial_rotary_factor).
  c.rotary_dim = static_cast<int64_t>(static_cast<double>(c.head_dim) * partial);
  if (c.rope_type == "llama3" && c.rotary_dim > 0) {
    c.rope_freq_factors = llama3_frequency_factors(c, llama3);
  }
  if (c.num_hidden_layers <= 0 || c.num_hidden_layers > 65536) {
    f.fail("num_hidden_layers",
           std::to_string(c.num_hidden_layers) + " is not in [1, 65536], the layers te-cpp builds");
  }
  c.layer_windows.assign(static_cast<std::size_t>(c.num_hidden_layers), std::nullopt);
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
