#include "te/hf/causal_lm.h"

#include <ATen/ATen.h>

#include "te/distributed.h"
#include "te/error.h"
#include "te/nn/functional.h"
#include "te/nn/random.h"

namespace te::hf {

namespace nn = te::nn;

nn::TransformerLayerOptions layer_options(const CausalLMConfig& c, int64_t layer) {
  // Llama's decoder layer as TE's TransformerLayer: pre-RMSNorm self attention (causal, RoPE on
  // the first rotary dims of each head, logits scaled by 1/sqrt(head_dim)) and a SwiGLU MLP
  // (silu(x W_gate) * x W_up, then W_down), no dropout on the residuals. GPT-2's: pre-LayerNorm,
  // biases everywhere, the fused c_attn, a gelu MLP, dropouts (learned positions: CausalLMImpl).
  auto o = nn::TransformerLayerOptions(c.hidden_size, c.intermediate_size, c.num_attention_heads)
               .num_gqa_groups(c.num_key_value_heads)
               .kv_channels(c.head_dim)
               .layer_type("encoder")
               .self_attn_mask_type("causal")
               .layernorm_type(c.norm)
               .layernorm_epsilon(c.rms_norm_eps)
               .mlp_activations(c.mlp_activations)
               .hidden_dropout(c.hidden_dropout)
               .attention_dropout(c.attention_dropout)
               .intermediate_dropout(0)
               .use_bias(c.attention_bias)
               .qkv_bias(c.qkv_bias)
               .mlp_bias(c.mlp_bias)
               .fuse_qkv(c.fuse_qkv)
               .scaled_query_init(false)
               .scale_attn_logits(true);
  // transformers' sliding window W: a query sees the W keys up to and including itself.
  TE_CHECK(layer >= 0 && layer < static_cast<int64_t>(c.layer_windows.size()),
           "layer_options: ", "layer ", layer, " of a config with ", c.layer_windows.size(),
           " layer windows");
  const auto& window = c.layer_windows[static_cast<std::size_t>(layer)];
  if (window) o.window_size(nn::WindowSize{*window - 1, 0});
  if (c.qk_norm) o.qk_norm_type("RMSNorm").qk_norm_eps(c.rms_norm_eps).qk_norm_before_rope(true);
  return o;
}

CausalLMImpl::CausalLMImpl(const CausalLMConfig& config_) : config(config_) { reset(); }

void CausalLMImpl::reset() {
  const CausalLMConfig& c = config;
  TE_CHECK(static_cast<int64_t>(c.layer_windows.size()) == c.num_hidden_layers,
           "CausalLM: the config has ", c.layer_windows.size(), " layer windows for ",
           c.num_hidden_layers, " layers; build the config with parse_causal_lm_config");
  embed = register_module(
      "embed", nn::Embedding(nn::EmbeddingOptions(c.vocab_size, c.hidden_size)
                                 .padding_idx(c.pad_token_id)
                                 .output_axes({axis::kBatch, axis::kSeqlen, axis::kHidden})));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers->push_back(nn::TransformerLayer(layer_options(c, i)));
  }
  if (c.positions == "learned") {
    position = register_module(
        "position", nn::Embedding(nn::EmbeddingOptions(c.max_position_embeddings, c.hidden_size)
                                      .embedding_axes({"position", axis::kEmbed})
                                      .output_axes({axis::kBatch, axis::kSeqlen, axis::kHidden})));
  }
  norm = register_module(
      "norm",
      nn::LayerNorm(
          nn::LayerNormOptions(c.hidden_size).layernorm_type(c.norm).epsilon(c.rms_norm_eps)));
  if (!c.tie_word_embeddings) {
    lm_head = register_module(
        "lm_head", nn::Dense(nn::DenseOptions(c.hidden_size, c.vocab_size)
                                 .use_bias(false)
                                 .kernel_axes({axis::kEmbed, axis::kVocab})
                                 .output_axes({axis::kBatch, axis::kSeqlen, axis::kVocab})));
  }
  if (c.positions != "rope") return;
  auto rope_options =
      nn::RotaryPositionEmbeddingOptions(c.rotary_dim == 0 ? c.head_dim : c.rotary_dim)
          .rotary_base(c.rope_theta);
  // transformers' linear scaling divides every position by the factor; TE's does so up to
  // pretrained * factor positions (then scales dynamically), so pretrained is set to
  // max_position_embeddings and longer sequences are refused in forward.
  if (c.rope_type == "linear") {
    TE_CHECK(c.max_position_embeddings > 0,
             "CausalLM: linear RoPE scaling needs "
             "max_position_embeddings in the config");
    rope_options.seq_len_interpolation_factor(c.rope_factor)
        .pretrained_max_position_embeddings(c.max_position_embeddings);
  }
  rope = register_module("rope", nn::RotaryPositionEmbedding(rope_options));
}

void CausalLMImpl::pretty_print(std::ostream& stream) const {
  stream << "te::hf::CausalLM(" << config.model_type << ", layers=" << config.num_hidden_layers
         << ", hidden=" << config.hidden_size << ", heads=" << config.num_attention_heads
         << ", kv_heads=" << config.num_key_value_heads << ", vocab=" << config.vocab_size
         << (config.tie_word_embeddings ? ", tied" : "") << ")";
}

namespace {

template <typename T>
T run(CausalLMImpl& m, const T& ids, int64_t batch, int64_t seq) {
  const CausalLMConfig& c = m.config;
  T x = m.embed(ids);
  if (m.position) {  // learned positions (GPT-2)
    TE_CHECK(seq <= c.max_position_embeddings, "CausalLM: ", seq,
             " tokens are more than the model's ", c.max_position_embeddings, " positions");
    const at::Tensor positions = at::arange(seq, at::kLong).expand({batch, seq}).contiguous();
    namespace F = nn::functional;
    x = F::dropout(F::add(x, m.position(F::laid_out_like(ids, positions))), c.embedding_dropout,
                   m.is_training());
  }
  TE_CHECK(
      c.rope_type != "linear" || static_cast<double>(seq) <=
                                     static_cast<double>(c.max_position_embeddings) * c.rope_factor,
      "CausalLM: ", seq, " positions are more than linear RoPE scaling covers (",
      c.max_position_embeddings, " x factor ", c.rope_factor,
      "); transformers would extrapolate there, te-cpp refuses");
  nn::AttentionArgs args;
  if (m.rope) args.rotary_pos_emb(m.rope->forward(seq));
  for (const auto& layer : *m.layers) {
    x = layer->as<nn::TransformerLayerImpl>()->forward(x, {}, {}, {}, args);
  }
  x = m.norm(x);
  return m.lm_head ? m.lm_head(x) : m.embed->attend(x);
}

}  // namespace

at::Tensor CausalLMImpl::forward(const at::Tensor& ids) {
  TE_CHECK(ids.dim() == 2, "CausalLM: ids must be [batch, seq], got ", ids.sizes());
  return run(*this, ids, ids.size(0), ids.size(1));
}

DTensor CausalLMImpl::forward(const DTensor& ids) {
  TE_CHECK(ids.dim() == 2, "CausalLM: ids must be [batch, seq], got ", ids.dim(), " dims");
  return run(*this, ids, ids.sizes()[0], ids.sizes()[1]);
}

DTensor CausalLMImpl::forward_on_mesh(const at::Tensor& ids) {
  const DeviceMesh* mesh = current_mesh();
  TE_CHECK(mesh != nullptr, "CausalLM::forward_on_mesh: no mesh in scope (open a MeshScope)");
  const std::vector<Placement> whole(static_cast<std::size_t>(mesh->ndim()), Replicate{});
  return forward(with_sharding_constraint(DTensor::distribute(ids, *mesh, whole),
                                          {axis::kBatch, axis::kSeqlen}));
}

}  // namespace te::hf
