#include "te/nn/transformer.h"

#include <ATen/ATen.h>

#include "constrain.h"
#include "forward.h"
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
                       .softmax_type(options.softmax_type())
                       .layernorm(norm)
                       .use_bias(options.use_bias())
                       .fuse_qkv(options.fuse_qkv())
                       .scaled_query_init(options.scaled_query_init())
                       .scale_attn_logits(options.scale_attn_logits())
                       .enable_sequence_parallel(options.enable_sequence_parallel())
                       .fused_attention(options.fused_attention())
                       .rotary_pos_interleaved(options.rotary_pos_interleaved())
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

namespace {

// TransformerLayer's one forward (modules/src/forward.h).
template <typename T>
T layer_forward(TransformerLayerImpl& self, const T& x_in, const at::Tensor& mask,
                const detail::Memory<T>& memory, const at::Tensor& memory_mask,
                const AttentionArgs& args) {
  const TransformerLayerOptions& o = self.options;
  TE_CHECK(o.layer_type() == "decoder" || !detail::has(memory),
           "TransformerLayer: an encoder takes no memory; build it with layer_type(\"decoder\")");
  TE_CHECK(o.layer_type() == "encoder" || detail::has(memory),
           "TransformerLayer: a decoder needs the encoder output (memory)");
  const double p = o.hidden_dropout();
  const bool training = self.is_training();
  auto drop = [p, training](const T& t) { return F::dropout(t, p, training); };
  const T x = with_sharding_constraint(
      x_in, {"batch", axis::seqlen(o.enable_sequence_parallel()), "hidden"});
  T h = F::add(drop(self.self_attention->forward(x, detail::Memory<T>(), mask, args)), x);
  if (self.cross_attention) {
    h = F::add(drop(self.cross_attention->forward(h, memory, memory_mask, args)), h);
  }
  return F::add(drop(self.mlp->forward(h)), h);
}

}  // namespace

at::Tensor TransformerLayerImpl::forward(const at::Tensor& x, const at::Tensor& mask,
                                         const at::Tensor& memory, const at::Tensor& memory_mask,
                                         const AttentionArgs& args) {
  return layer_forward(*this, x, mask, memory, memory_mask, args);
}

DTensor TransformerLayerImpl::forward(const DTensor& x, const at::Tensor& mask,
                                      const std::optional<DTensor>& memory,
                                      const at::Tensor& memory_mask, const AttentionArgs& args) {
  return layer_forward(*this, x, mask, memory, memory_mask, args);
}

}  // namespace te::nn
