// GPT-2: transformers' GPT2LMHeadModel (GPT2Config's names and defaults). Learned positions,
// pre-LayerNorm layers, biases on every projection, a fused query/key/value projection (c_attn),
// the MLP's one activation, a tied head. Checkpoints saved from GPT2Model (openai-community/
// gpt2's own) name their tensors without the "transformer." prefix. te-cpp reads no GGUF file of
// it.

#include <algorithm>

#include "family.h"

namespace te::hf::detail {

namespace {

void read_config(Fields& f, CausalLMConfig& c) {
  c.vocab_size = f.integer_or("vocab_size", 50257);
  c.max_position_embeddings = f.integer_or("n_positions", 1024);
  if (f.has("n_ctx") && f.integer("n_ctx") != c.max_position_embeddings) {
    f.fail("n_ctx", "differs from n_positions; te-cpp takes one context length");
  }
  c.hidden_size = f.integer_or("n_embd", 768);
  c.num_hidden_layers = f.integer_or("n_layer", 12);
  c.num_attention_heads = f.integer_or("n_head", 12);
  c.num_key_value_heads = c.num_attention_heads;
  if (c.num_attention_heads <= 0 || c.hidden_size % c.num_attention_heads != 0) {
    f.fail("n_head", std::to_string(c.num_attention_heads) + " does not divide n_embd " +
                         std::to_string(c.hidden_size));
  }
  // Bounded before anything is sized or multiplied by them.
  check_model_sizes({{"vocab_size", c.vocab_size},
                     {"n_embd", c.hidden_size},
                     {"n_layer", c.num_hidden_layers},
                     {"n_head", c.num_attention_heads},
                     {"n_positions", c.max_position_embeddings}},
                    c.num_hidden_layers, f.path());
  c.head_dim = c.hidden_size / c.num_attention_heads;
  c.intermediate_size = f.has("n_inner") ? f.integer("n_inner") : 4 * c.hidden_size;
  // transformers' ACT2FN: gelu_new and gelu_pytorch_tanh are the tanh form, gelu the erf form.
  const std::string act = f.string_or("activation_function", "gelu_new");
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
    c.mlp_activations = {"gelu"};
  } else if (act == "gelu") {
    c.mlp_activations = {"gelu_exact"};
  } else if (act == "relu" || act == "silu") {
    c.mlp_activations = {act};
  } else {
    f.fail("activation_function", "'" + act +
                                      "' is not one te-cpp builds (gelu_new, gelu_pytorch_tanh, "
                                      "gelu, relu, silu)");
  }
  c.hidden_dropout = f.number_or("resid_pdrop", 0.1);
  c.embedding_dropout = f.number_or("embd_pdrop", 0.1);
  c.attention_dropout = f.number_or("attn_pdrop", 0.1);
  c.rms_norm_eps = f.number_or("layer_norm_epsilon", 1e-5);
  if (!f.boolean_or("scale_attn_weights", true)) {
    f.fail("scale_attn_weights", "false: te-cpp scales the logits by 1/sqrt(head_dim)");
  }
  if (f.boolean_or("scale_attn_by_inverse_layer_idx", false)) {
    f.fail("scale_attn_by_inverse_layer_idx", "true is not implemented");
  }
  // Upcasting the logits to fp32 changes nothing in fp32, which te computes them in.
  f.boolean_or("reorder_and_upcast_attn", false);
  if (f.boolean_or("add_cross_attention", false)) {
    f.fail("add_cross_attention", "true adds cross attention; te-cpp builds the decoder alone");
  }
  // pad_token_id stays metadata: GPT-2's wte has no padding_idx (modeling_gpt2.py), its row trains.
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", true);
  c.positions = "learned";
  c.norm = "layernorm";
  c.fuse_qkv = true;
  c.attention_bias = c.qkv_bias = c.mlp_bias = true;
  c.rotary_dim = c.head_dim;
  c.layer_windows.assign(static_cast<std::size_t>(std::max<int64_t>(c.num_hidden_layers, 0)),
                         std::nullopt);
}

// Conv1D weights are [in, out] already, as te keeps kernels; c_attn's columns are the query, key
// and value slots of the fused qkv_kernel [in, 3, out].
WeightMap weight_map(const CausalLMConfig& c) {
  WeightMap m;
  const int64_t h = c.hidden_size;
  auto whole = [&](const std::string& te, const std::string& hf) { m[te] = {{hf}}; };
  auto norm = [&](const std::string& te, const std::string& hf) {
    whole(te + ".scale", hf + ".weight");
    whole(te + ".ln_bias", hf + ".bias");
  };
  whole("embed.embedding", "transformer.wte.weight");
  whole("position.embedding", "transformer.wpe.weight");
  norm("norm", "transformer.ln_f");
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string te = "layers." + std::to_string(i) + ".";
    const std::string hf = "transformer.h." + std::to_string(i) + ".";
    norm(te + "self_attention.layernorm", hf + "ln_1");
    for (int64_t k = 0; k < 3; ++k) {
      m[te + "self_attention.qkv_kernel"].push_back(
          {hf + "attn.c_attn.weight", 1, k, false, 1, k * h, h, 3 * h});
      m[te + "self_attention.qkv_bias"].push_back(
          {hf + "attn.c_attn.bias", 0, k, false, 0, k * h, h, 3 * h});
    }
    whole(te + "self_attention.out_kernel", hf + "attn.c_proj.weight");
    whole(te + "self_attention.out_bias", hf + "attn.c_proj.bias");
    norm(te + "mlp.layernorm", hf + "ln_2");
    m[te + "mlp.wi_kernel"] = {{hf + "mlp.c_fc.weight", 1, 0, false}};
    m[te + "mlp.wi_bias"] = {{hf + "mlp.c_fc.bias", 0, 0, false}};
    whole(te + "mlp.wo_kernel", hf + "mlp.c_proj.weight");
    whole(te + "mlp.wo_bias", hf + "mlp.c_proj.bias");
  }
  // An untied head is an nn.Linear [vocab, hidden]: transposed.
  if (!c.tie_word_embeddings) m["lm_head.kernel"] = {{"lm_head.weight", -1, 0, true}};
  return m;
}

// The causal-mask buffers each block saves (attn.bias, attn.masked_bias) are not weights.
bool derived(const std::string& name, const std::string& prefix) {
  const auto ends = [&](const std::string& tail) {
    return name.size() > tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return name.rfind(prefix + "h.", 0) == 0 && (ends(".attn.bias") || ends(".attn.masked_bias"));
}

}  // namespace

const Family& gpt2_family() {
  static const Family kFamily = [] {
    Family f;
    f.info = {"gpt2", "GPT2LMHeadModel", "", "GPT-2"};
    f.read_config = read_config;
    // A task head's fields (GPT2DoubleHeadsModel's summary) and generation settings.
    f.metadata = {"summary_activation", "summary_first_dropout", "summary_proj_to_labels",
                  "summary_type",       "summary_use_proj",      "task_specific_params"};
    f.weight_map = weight_map;
    f.base_prefix = "transformer.";
    f.derived = derived;
    return f;
  }();
  return kFamily;
}

}  // namespace te::hf::detail
