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

namespace {

// What TransformerLayer's options must satisfy before anything is built.
void check_layer_options(const TransformerLayerOptions& o) {
  TE_CHECK(o.layer_type() == "encoder" || o.layer_type() == "decoder",
           "TransformerLayer: layer_type '", o.layer_type(), "' is not 'encoder' or 'decoder'");
  TE_CHECK(o.hidden_dropout() >= 0 && o.hidden_dropout() < 1, "TransformerLayer: hidden_dropout ",
           o.hidden_dropout(), " is not in [0, 1)");
  TE_CHECK(o.drop_path_rate() >= 0 && o.drop_path_rate() < 1, "TransformerLayer: drop_path_rate ",
           o.drop_path_rate(), " is not in [0, 1)");
  if (o.parallel_attention_mlp()) {  // transformer.py L376-390 at d0067d0da
    TE_CHECK(o.layer_type() == "encoder",
             "TransformerLayer: parallel_attention_mlp needs layer_type 'encoder', got '",
             o.layer_type(), "'");
    TE_CHECK(!o.apply_residual_connection_post_layernorm() && !o.output_layernorm(),
             "TransformerLayer: parallel_attention_mlp cannot be combined with "
             "apply_residual_connection_post_layernorm or output_layernorm");
  }
  if (o.post_block_layernorm()) {
    TE_CHECK(o.layer_type() == "encoder" && !o.parallel_attention_mlp(),
             "TransformerLayer: post_block_layernorm needs layer_type 'encoder' (got '",
             o.layer_type(), "') without parallel_attention_mlp");
  }
  const MultiHeadAttentionOptions& attention = o.self_attention();
  TE_CHECK(attention.hidden_size() == o.hidden_size(),
           "TransformerLayer: self_attention's hidden_size ", attention.hidden_size(),
           " differs from the layer's ", o.hidden_size());
  TE_CHECK(attention.self_attention(),
           "TransformerLayer: self_attention().self_attention() is false; the layer's first "
           "attention is self attention (a decoder adds the cross attention)");
  TE_CHECK(attention.input_layernorm(),
           "TransformerLayer: self_attention().input_layernorm() is false; the layer sets it: "
           "use output_layernorm(true) for a norm after the layer instead of before");
  TE_CHECK(attention.attention().qkv_format() != QkvFormat::kSbhd,
           "TransformerLayer: attn_input_format 'sbhd' is not 'bshd' or 'thd'");
  if (attention.attention().qkv_format() == QkvFormat::kThd) {
    TE_CHECK(F::mask_spec(attention.attention().attn_mask_type()).padding(),
             "TransformerLayer: attn_input_format 'thd' needs a padding self_attn_mask_type "
             "(padding, padding_causal or padding_causal_bottom_right), as TE's; got '",
             attention.attention().attn_mask_type(), "'");
    TE_CHECK(o.layer_type() == "encoder",
             "TransformerLayer: attn_input_format 'thd' needs layer_type 'encoder' (the cross "
             "attention takes bshd here)");
    TE_CHECK(o.drop_path_rate() == 0,
             "TransformerLayer: drop_path_rate with attn_input_format 'thd' is not supported "
             "(TE's drop path draws per row of dim 0, here per token): set it to 0 or use bshd");
  }
  TE_CHECK(attention.qkv_kernel_axes().size() == 3,
           "TransformerLayer: qkv_kernel_axes needs 3 "
           "axes (hidden, 3, heads*head_dim), got ",
           to_string(attention.qkv_kernel_axes()));
}

// A decoder's cross attention: the self attention's options attending to the memory, with a
// padding mask and query / key-value kernels whose axes follow the fused kernel's.
MultiHeadAttentionOptions cross_attention_options(const TransformerLayerOptions& options) {
  MultiHeadAttentionOptions cross = options.self_attention();
  const LogicalAxes& qkv = cross.qkv_kernel_axes();
  cross.self_attention(false).q_kernel_axes({qkv[0], qkv[2]}).kv_kernel_axes(qkv);
  // The memory is another sequence: context parallelism splits one sequence for q, k and v
  // alike (self attention), so cross attention takes no cp_comm_type and its queries attend to
  // the memory whole.
  cross.attention()
      .attn_mask_type(AttnMaskType::kPadding)
      .window_size(std::nullopt)
      .bottom_right_diagonal(std::nullopt)
      .cp_comm_type(std::nullopt)
      .cp_load_balanced(false);
  return cross;
}

}  // namespace

void TransformerLayerImpl::reset() {
  check_layer_options(options);
  const MultiHeadAttentionOptions& attention = options.self_attention();
  const LayerNormOptions& norm = attention.layernorm();
  self_attention = register_module(
      "self_attention", MultiHeadAttention(MultiHeadAttentionOptions(attention).input_layernorm(
                            !options.output_layernorm())));
  if (options.layer_type() == "decoder") {
    cross_attention =
        register_module("cross_attention", MultiHeadAttention(cross_attention_options(options)));
  }
  const char* seq = axis::seqlen(attention.enable_sequence_parallel());
  if (options.output_layernorm()) {
    layernorm = register_module("layernorm", LayerNorm(norm));
  }
  if (options.post_block_layernorm()) {
    post_attention_layernorm = register_module("post_attention_layernorm", LayerNorm(norm));
    post_mlp_layernorm = register_module("post_mlp_layernorm", LayerNorm(norm));
  }
  if (options.moe()) {
    TE_CHECK(options.moe()->hidden_size() == options.hidden_size(), "TransformerLayer: moe's ",
             "hidden_size ", options.moe()->hidden_size(), " differs from the layer's ",
             options.hidden_size());
    TE_CHECK(options.moe()->aux_loss_coeff() == 0 && options.moe()->z_loss_coeff() == 0,
             "TransformerLayer: moe's aux_loss_coeff (", options.moe()->aux_loss_coeff(),
             ") and z_loss_coeff (", options.moe()->z_loss_coeff(),
             ") must be 0: the layer returns its output alone, so the loss would be dropped; "
             "call the LayerNormMoE's forward_with_aux_loss to train with it");
    moe = register_module(
        "moe", LayerNormMoE(LayerNormMoEOptions(*options.moe())
                                .layernorm(norm)
                                .layernorm_input_axes({axis::kBatch, seq, axis::kHidden})
                                .dot_1_input_axes({axis::kBatch, axis::kSeqlen, axis::kHidden})
                                .output_axes({axis::kBatch, seq, axis::kHidden})));
    return;
  }
  mlp = register_module(
      "mlp", LayerNormMLP(LayerNormMLPOptions(options.hidden_size(), options.mlp_hidden_size())
                              .layernorm(norm)
                              .activations(options.mlp_activations())
                              .activation_params(options.activation_params())
                              .intermediate_dropout_rate(options.intermediate_dropout())
                              .use_bias(options.mlp_bias().value_or(attention.use_bias()))
                              .kernel_axes_1(options.mlp_kernel_axes_1())
                              .kernel_axes_2(options.mlp_kernel_axes_2())
                              .layernorm_input_axes({axis::kBatch, seq, axis::kHidden})
                              .dot_1_input_axes({axis::kBatch, axis::kSeqlen, axis::kHidden})
                              .dot_2_input_axes({axis::kBatch, axis::kSeqlen, axis::kHiddenTp})
                              .output_axes({axis::kBatch, seq, axis::kHidden})));
}

void TransformerLayerImpl::pretty_print(std::ostream& stream) const {
  stream << "te::nn::TransformerLayer(" << options.layer_type()
         << ", hidden_size=" << options.hidden_size()
         << ", mlp_hidden_size=" << options.mlp_hidden_size()
         << ", heads=" << options.self_attention().attention().num_attention_heads()
         << ", self_attn_mask=" << options.self_attention().attention().attn_mask_type()
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
  const MultiHeadAttentionOptions& attention = o.self_attention();
  if (attention.attention().qkv_format() == QkvFormat::kThd &&
      x_in.dim() == 2) {  // [tokens, hidden]: a batch of one
    const bool cp = attention.attention().cp_comm_type().has_value();
    return detail::tokens_only(
        layer_forward(self, detail::batch_of_one(x_in, cp), mask, memory, memory_mask, args), cp);
  }
  const bool training = self.is_training();
  // TE's _bias_dropout_add (transformer.py L976-998 at d0067d0da): hidden dropout, then drop
  // path on the self attention's and the MLP's branches, then the residual.
  auto add = [&](const T& branch, const T& residual, bool drop_path) {
    T out = F::dropout(branch, o.hidden_dropout(), training);
    if (drop_path) out = F::drop_path(out, o.drop_path_rate(), training);
    return F::add(out, residual);
  };
  const bool post_ln_residual = o.apply_residual_connection_post_layernorm();
  const T x = with_sharding_constraint(
      x_in, {axis::kBatch, axis::seqlen(attention.enable_sequence_parallel()), axis::kHidden});
  // transformer.py L869-975: the residual of each block is its input, or with
  // apply_residual_connection_post_layernorm its norm's output (the self attention has none
  // under output_layernorm: its residual stays x).
  // post_block_layernorm: each block's output normalised before its residual add (Gemma 2's
  // Gemma2DecoderLayer.forward, transformers 5.23.0).
  auto post = [](LayerNorm& norm, const T& branch) {
    return norm ? norm->forward(branch) : branch;
  };
  auto [attn, attn_ln] =
      self.self_attention->forward_with_layernorm_output(x, detail::Memory<T>(), mask, args);
  attn = post(self.post_attention_layernorm, attn);
  T h = x;
  if (!o.parallel_attention_mlp()) {
    h = add(attn, post_ln_residual && !o.output_layernorm() ? attn_ln : x, true);
  }
  if (self.cross_attention) {
    const auto [cross, cross_ln] =
        self.cross_attention->forward_with_layernorm_output(h, memory, memory_mask, args);
    h = add(cross, post_ln_residual ? cross_ln : h, false);
  }
  auto [mlp, mlp_ln] = self.moe ? self.moe->forward_with_layernorm_output(h)
                                : self.mlp->forward_with_layernorm_output(h);
  mlp = post(self.post_mlp_layernorm, mlp);
  T out = o.parallel_attention_mlp() ? add(F::add(attn, mlp), h, true)
                                     : add(mlp, post_ln_residual ? mlp_ln : h, true);
  if (self.layernorm) out = self.layernorm->forward(out);
  return out;
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
