#include "te/nn/transformer.h"

#include <ATen/ATen.h>

#include "constrain.h"
#include "te/error.h"
#include "te/nn/functional.h"
#include "te/nn/random.h"

namespace te::nn {

namespace F = functional;

TransformerLayerImpl::TransformerLayerImpl(const TransformerLayerOptions& options_)
    : options(options_) {
  reset();
}

void TransformerLayerImpl::reset() {
  TE_CHECK(options.layer_type() == "encoder" || options.layer_type() == "decoder",
           "TransformerLayer: layer_type '", options.layer_type(),
           "' is not 'encoder' or 'decoder'");
  TE_CHECK(options.hidden_dropout() >= 0 && options.hidden_dropout() < 1,
           "TransformerLayer: hidden_dropout ", options.hidden_dropout(), " is not in [0, 1)");
  const auto norm = LayerNormOptions(options.hidden_size())
                        .layernorm_type(options.layernorm_type())
                        .epsilon(options.layernorm_epsilon())
                        .zero_centered_gamma(options.zero_centered_gamma());
  auto attention = MultiHeadAttentionOptions(options.hidden_size(), options.num_attention_heads())
                       .num_gqa_groups(options.num_gqa_groups())
                       .attention_dropout(options.attention_dropout())
                       .layernorm(norm)
                       .use_bias(options.use_bias())
                       .fuse_qkv(options.fuse_qkv())
                       .scaled_query_init(options.scaled_query_init())
                       .scale_attn_logits(options.scale_attn_logits())
                       .enable_sequence_parallel(options.enable_sequence_parallel())
                       .fused_attention(options.fused_attention())
                       .qkv_kernel_axes(options.qkv_kernel_axes())
                       .kv_kernel_axes(options.qkv_kernel_axes())
                       .out_kernel_axes(options.out_kernel_axes());
  TE_CHECK(options.qkv_kernel_axes().size() == 3,
           "TransformerLayer: qkv_kernel_axes needs 3 "
           "axes (hidden, 3, heads*head_dim), got ",
           to_string(options.qkv_kernel_axes()));
  attention.q_kernel_axes({options.qkv_kernel_axes()[0], options.qkv_kernel_axes()[2]});
  self_attention = register_module(
      "self_attention",
      MultiHeadAttention(MultiHeadAttentionOptions(attention)
                             .attn_mask_type(options.self_attn_mask_type())
                             .window_size(options.window_size())
                             .bottom_right_diagonal(options.bottom_right_diagonal())));
  if (options.layer_type() == "decoder") {
    cross_attention = register_module(
        "cross_attention",
        MultiHeadAttention(
            MultiHeadAttentionOptions(attention).attn_mask_type("padding").self_attention(false)));
  }
  const char* seq = axis::seqlen(options.enable_sequence_parallel());
  mlp = register_module(
      "mlp", LayerNormMLP(LayerNormMLPOptions(options.hidden_size(), options.mlp_hidden_size())
                              .layernorm(norm)
                              .activations(options.mlp_activations())
                              .intermediate_dropout_rate(options.intermediate_dropout())
                              .use_bias(options.use_bias())
                              .kernel_axes_1(options.mlp_kernel_axes_1())
                              .kernel_axes_2(options.mlp_kernel_axes_2())
                              .layernorm_input_axes({"batch", seq, "hidden"})
                              .dot_1_input_axes({"batch", "seqlen", "hidden"})
                              .dot_2_input_axes({"batch", "seqlen", "hidden_tp"})
                              .output_axes({"batch", seq, "hidden"})));
}

void TransformerLayerImpl::pretty_print(std::ostream& stream) const {
  stream << "te::nn::TransformerLayer(" << options.layer_type()
         << ", hidden_size=" << options.hidden_size()
         << ", mlp_hidden_size=" << options.mlp_hidden_size()
         << ", heads=" << options.num_attention_heads()
         << ", self_attn_mask=" << options.self_attn_mask_type()
         << ", hidden_dropout=" << options.hidden_dropout() << ")";
}

at::Tensor TransformerLayerImpl::forward(const at::Tensor& x, const at::Tensor& mask,
                                         const at::Tensor& memory, const at::Tensor& memory_mask) {
  TE_CHECK(options.layer_type() == "decoder" || !memory.defined(),
           "TransformerLayer: an encoder takes no memory; build it with layer_type(\"decoder\")");
  TE_CHECK(options.layer_type() == "encoder" || memory.defined(),
           "TransformerLayer: a decoder needs the encoder output (memory)");
  const double p = options.hidden_dropout();
  const bool training = is_training();
  at::Tensor h = x + F::dropout(self_attention->forward(x, {}, mask), p, training);
  if (cross_attention) {
    h = h + F::dropout(cross_attention->forward(h, memory, memory_mask), p, training);
  }
  return h + F::dropout(mlp->forward(h), p, training);
}

DTensor TransformerLayerImpl::forward(const DTensor& x_in, const at::Tensor& mask,
                                      const std::optional<DTensor>& memory,
                                      const at::Tensor& memory_mask) {
  TE_CHECK(options.layer_type() == "decoder" || !memory,
           "TransformerLayer: an encoder takes no memory; build it with layer_type(\"decoder\")");
  TE_CHECK(options.layer_type() == "encoder" || memory,
           "TransformerLayer: a decoder needs the encoder output (memory)");
  const char* seq = axis::seqlen(options.enable_sequence_parallel());
  const LogicalAxes act = {"batch", seq, "hidden"};
  const double p = options.hidden_dropout();
  const bool training = is_training();
  auto drop = [p, training](const DTensor& t) { return F::dropout(t, p, training); };
  const DTensor x = with_sharding_constraint(x_in, act);
  DTensor h = F::add(drop(self_attention->forward(x, std::nullopt, mask)), x);
  if (cross_attention) {
    h = F::add(drop(cross_attention->forward(h, memory, memory_mask)), h);
  }
  return F::add(drop(mlp->forward(h)), h);
}

}  // namespace te::nn
