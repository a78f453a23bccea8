// gpt-oss: transformers' GptOssForCausalLM (5.23.0 models/gpt_oss). Llama's decoder with q/k/v/o
// biases, a learned sink per head in every attention (self_attn.sinks), windows of
// sliding_window (128) on the layers layer_types names (by default the even ones: 0, 2, ...),
// YaRN RoPE by default (factor 32 over 4096 positions, base 150000, not truncated), and every MLP
// sparse: num_local_experts experts of intermediate_size with biases, the softmax of the top
// num_experts_per_tok of the router's biased logits, and a clamped SwiGLU,
// (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g), g = min(gate, limit). The experts are
// saved fused (fused_experts_weight_map). The checkpoints OpenAI publishes hold MXFP4 experts
// (quantization_config): te-cpp refuses them and loads a dequantized (bf16) copy, or llama.cpp's
// GGUF file of them ("gpt-oss"), whose MXFP4 experts it holds in their blocks.

#include "moe_decoder.h"

namespace te::hf::detail {

namespace {

// What every gpt-oss layer is, whatever the file: learned sinks, the clamped SwiGLU of biased
// experts, the router's bias (GptOssAttention, GptOssExperts, GptOssTopKRouter).
void set_gpt_oss_layers(CausalLMConfig& c) {
  c.attention_sinks = true;
  c.mlp_activations = {"clamped_silu", "clamped_linear"};
  c.router_bias = true;
  c.mlp_bias = true;
}

// GptOssConfig.__post_init__'s rope_parameters when config.json has none.
const json& default_rope() {
  static const json kYarn = {{"rope_type", "yarn"}, {"factor", 32.0},
                             {"beta_fast", 32.0},   {"beta_slow", 1.0},
                             {"truncate", false},   {"original_max_position_embeddings", 4096}};
  return kYarn;
}

void read_config(Fields& f, CausalLMConfig& c) {
  if (f.contains("quantization_config")) {
    f.fail("quantization_config",
           "te-cpp reads gpt-oss's experts in floating point, not MXFP4; load a dequantized copy "
           "(transformers: Mxfp4Config(dequantize=True), then save_pretrained)");
  }
  DecoderDefaults defaults;  // GptOssConfig's
  defaults.max_position_embeddings = 131072;
  defaults.rms_norm_eps = 1e-5;
  defaults.activation_field = nullptr;  // hidden_act is unused: GptOssExperts' own gate
  defaults.head_dim = f.contains("head_dim") && !f.has("head_dim") ? 0 : 64;  // null: H / heads
  defaults.rope.theta = 150000;
  defaults.rope.default_parameters = default_rope();
  read_rope_decoder_config(f, c, defaults);
  set_gpt_oss_layers(c);
  c.swiglu_limit = f.number_or("swiglu_limit", 7.0);
  c.swiglu_alpha = f.number_or("swiglu_alpha", 1.702);
  c.attention_bias = f.boolean_or("attention_bias", true);
  c.qkv_bias = c.attention_bias;
  // transformers builds both masks whatever the layers are, and a null window cannot make one
  // (masking_utils.create_sliding_window_causal_mask): refused even with no sliding layer.
  if (f.contains("sliding_window") && !f.has("sliding_window")) {
    f.fail("sliding_window", "is null; transformers' gpt-oss needs a window (128 by default)");
  }
  read_alternating_windows(f, c, 2, 128);
  read_moe_config(f, c, {"num_local_experts", false, false});
}

// llama.cpp's gpt-oss (conversion/gpt_oss.py GptOssModel; src/models/openai-moe.cpp at
// llama-cpp-python 0.3.36's vendored llama.cpp 0c1e570): q/k/v/o biases, sinks, the softmax of the
// router's top k (SOFTMAX_WEIGHT: the softmax renormalised over the chosen), the experts'
// biases, llama-graph.cpp's LLM_FFN_SWIGLU_OAI_MOE with its constants alpha 1.702 and limit 7
// (the file keeps neither), windows of attention.sliding_window on the even layers
// (load_swa_pattern(ml, 2) without a pattern key), YaRN from the rope.scaling keys.
void read_gguf_config(GgufKeys& k, CausalLMConfig& c) {
  MoeGguf m;
  m.ffn_length_required = true;
  read_moe_gguf(k, c, m);  // router_aux_loss_coef 0.001, GptOssConfig's too
  set_gpt_oss_layers(c);
  c.swiglu_limit = 7.0;
  c.swiglu_alpha = 1.702;
  const auto window = k.integer("attention.sliding_window");
  if (!window || *window <= 0) {
    k.fail("attention.sliding_window", "is missing or not positive; gpt-oss's even layers slide");
  }
  for (int64_t i = 0; i < c.num_hidden_layers; i += 2) {
    c.layer_windows[static_cast<std::size_t>(i)] = *window;
  }
}

}  // namespace

const Family& gpt_oss_family() {
  static const Family kFamily = [] {
    Family f =
        rope_decoder_family({"gpt_oss", "GptOssForCausalLM", "gpt-oss", "gpt-oss"}, read_config);
    f.weight_map = fused_experts_weight_map;
    f.gguf = &fused_experts_gguf();
    f.gguf_weight_map = fused_experts_gguf_weight_map;
    f.read_gguf_config = read_gguf_config;
    // Fields transformers' GptOssConfig reads and never uses (hidden_act), or stores unread from
    // the published config.json (experts_per_token, initial_context_length).
    f.metadata = {"hidden_act", "experts_per_token", "initial_context_length"};
    return f;
  }();
  return kFamily;
}

}  // namespace te::hf::detail
