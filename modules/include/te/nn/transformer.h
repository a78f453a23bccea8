#pragma once

// te::nn::TransformerLayer: Transformer Engine's TransformerLayer (pre-LN residual blocks of
// self attention, cross attention for decoders, and an MLP) in LibTorch's module idiom.

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <optional>
#include <string>
#include <vector>

#include "te/nn/attention.h"
#include "te/nn/mlp.h"

namespace te::nn {

/// Options for TransformerLayer(hidden, ffn_hidden, heads).
///
/// Example:
///   te::nn::TransformerLayer layer(te::nn::TransformerLayerOptions(256, 1024, 8)
///                                      .self_attn_mask_type("padding")
///                                      .mlp_activations({"gelu"}));
struct TransformerLayerOptions {
  TransformerLayerOptions(int64_t hidden_size, int64_t mlp_hidden_size, int64_t num_attention_heads)
      : hidden_size_(hidden_size),
        mlp_hidden_size_(mlp_hidden_size),
        num_attention_heads_(num_attention_heads) {}
  TORCH_ARG(int64_t, hidden_size);
  TORCH_ARG(int64_t, mlp_hidden_size);
  TORCH_ARG(int64_t, num_attention_heads);
  TORCH_ARG(int64_t, num_gqa_groups) = 0;
  /// The attention's head dim (TE's kv_channels; 0: hidden_size / num_attention_heads): the QKV
  /// kernel is (hidden, 3, heads * kv_channels), the output one (heads * kv_channels, hidden).
  TORCH_ARG(int64_t, kv_channels) = 0;
  /// "encoder" or "decoder" (adds cross attention to the encoder's output).
  TORCH_ARG(std::string, layer_type) = "encoder";
  /// The self attention's attn_mask_type, window_size and bottom_right_diagonal
  /// (DotProductAttentionOptions), as TE's TransformerLayer takes them.
  TORCH_ARG(std::string, self_attn_mask_type) = "causal";
  TORCH_ARG(std::optional<WindowSize>, window_size) = std::nullopt;
  TORCH_ARG(std::optional<bool>, bottom_right_diagonal) = std::nullopt;
  /// TE's attn_input_format: "bshd" (x [batch, seqlen, hidden]) or "thd" (packed sequences
  /// x [tokens, hidden] with AttentionArgs' cu_seqlens; a padding self_attn_mask_type; encoders,
  /// no drop path). MultiHeadAttentionOptions::qkv_format.
  TORCH_ARG(std::string, attn_input_format) = "bshd";
  TORCH_ARG(std::string, layernorm_type) = "layernorm";
  TORCH_ARG(double, layernorm_epsilon) = 1e-6;
  TORCH_ARG(bool, zero_centered_gamma) = false;
  /// Dropout after each block, before the residual add (training only).
  TORCH_ARG(double, hidden_dropout) = 0.1;
  TORCH_ARG(double, attention_dropout) = 0.1;
  TORCH_ARG(double, intermediate_dropout) = 0.1;
  /// DotProductAttentionOptions::softmax_type for both attentions (TE's softmax_type).
  TORCH_ARG(std::string, softmax_type) = "vanilla";
  /// The MLP's activations: TE-JAX's slot list or one TE-PyTorch name (LayerNormMLPOptions), and
  /// clamped_swiglu's parameters.
  TORCH_ARG(std::vector<std::string>, mlp_activations) = {"relu"};
  TORCH_ARG(functional::ActivationParams, activation_params) = {};
  /// Layer structure, as TE's TransformerLayer (transformer.py L860-975 at d0067d0da):
  /// output_layernorm: no norm before the attention, a norm ("layernorm") after the layer, the
  /// post-LN layer of BERT when combined with apply_residual_connection_post_layernorm, which
  /// makes each block's residual its norm's output instead of its input.
  TORCH_ARG(bool, apply_residual_connection_post_layernorm) = false;
  TORCH_ARG(bool, output_layernorm) = false;
  /// x + drop(attn(ln(x)) + mlp(ln'(x))) (GPT-J, PaLM): encoders only, neither of the above.
  TORCH_ARG(bool, parallel_attention_mlp) = false;
  /// Stochastic depth on the self attention's and the MLP's branch (functional::drop_path).
  TORCH_ARG(double, drop_path_rate) = 0.0;
  /// MultiHeadAttentionOptions' qk_norm_type, qk_norm_eps, qk_norm_before_rope for both
  /// attentions.
  TORCH_ARG(std::optional<std::string>, qk_norm_type) = std::nullopt;
  TORCH_ARG(double, qk_norm_eps) = 1e-6;
  TORCH_ARG(bool, qk_norm_before_rope) = false;
  /// Biases on every projection of the attentions and the MLP (TE's bias).
  TORCH_ARG(bool, use_bias) = false;
  /// Overrides of use_bias (nullopt: as use_bias): the query/key/value projections only
  /// (Qwen2's attention), and the MLP's two projections (Llama's mlp_bias).
  TORCH_ARG(std::optional<bool>, qkv_bias) = std::nullopt;
  TORCH_ARG(std::optional<bool>, mlp_bias) = std::nullopt;
  TORCH_ARG(bool, fuse_qkv) = true;
  /// Kernel logical axes: attention QKV (hidden, 3, heads*head_dim) and output
  /// (heads*head_dim, hidden); MLP fc1 (hidden, activations, ffn) and fc2 (ffn, hidden). Cross
  /// attention derives its query (first and last of qkv) and key/value (qkv) axes.
  TORCH_ARG(LogicalAxes, qkv_kernel_axes) = axis::joined_in_kernel();
  TORCH_ARG(LogicalAxes, out_kernel_axes) = axis::out_kernel();
  TORCH_ARG(LogicalAxes, mlp_kernel_axes_1) = axis::joined_in_kernel();
  TORCH_ARG(LogicalAxes, mlp_kernel_axes_2) = axis::out_kernel();
  TORCH_ARG(bool, scaled_query_init) = true;
  TORCH_ARG(bool, scale_attn_logits) = false;
  /// Sequence parallel (with a tpsp MeshResource or rules for seqlen_tp).
  TORCH_ARG(bool, enable_sequence_parallel) = false;
  TORCH_ARG(bool, fused_attention) = true;
  /// MultiHeadAttentionOptions::rotary_pos_interleaved for both attentions.
  TORCH_ARG(bool, rotary_pos_interleaved) = false;
};

/// x -> x + drop(attn(ln(x))) [-> + drop(cross_attn(ln(.), memory))] -> + drop(mlp(ln(.))), or
/// the post-LN and parallel structures the options choose.
class TransformerLayerImpl : public torch::nn::Cloneable<TransformerLayerImpl>,
                             public ShardedModule {
 public:
  TransformerLayerImpl(int64_t hidden, int64_t ffn, int64_t heads)
      : TransformerLayerImpl(TransformerLayerOptions(hidden, ffn, heads)) {}
  explicit TransformerLayerImpl(const TransformerLayerOptions& options);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// `mask`: padding mask of the self attention; `memory` and `memory_mask`: the encoder
  /// output and its padding mask, for decoders; `args`: the bias and the RoPE frequencies
  /// (AttentionArgs) for the self and the cross attention, as TE's TransformerLayer passes them.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask = {},
                     const at::Tensor& memory = {}, const at::Tensor& memory_mask = {},
                     const AttentionArgs& args = {});
  DTensor forward(const DTensor& x, const at::Tensor& mask = {},
                  const std::optional<DTensor>& memory = std::nullopt,
                  const at::Tensor& memory_mask = {}, const AttentionArgs& args = {});

  TransformerLayerOptions options;
  MultiHeadAttention self_attention{nullptr};
  MultiHeadAttention cross_attention{nullptr};
  LayerNormMLP mlp{nullptr};
  /// output_layernorm: the norm after the layer (else null).
  LayerNorm layernorm{nullptr};
};

class TransformerLayer : public torch::nn::ModuleHolder<TransformerLayerImpl> {
 public:
  using torch::nn::ModuleHolder<TransformerLayerImpl>::ModuleHolder;
  using Impl = TransformerLayerImpl;
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& mask = {},
                        const at::Tensor& memory = {}, const at::Tensor& memory_mask = {},
                        const AttentionArgs& args = {}) {
    return get()->forward(x, mask, memory, memory_mask, args);
  }
  DTensor operator()(const DTensor& x, const at::Tensor& mask = {},
                     const std::optional<DTensor>& memory = std::nullopt,
                     const at::Tensor& memory_mask = {}, const AttentionArgs& args = {}) {
    return get()->forward(x, mask, memory, memory_mask, args);
  }
};

}  // namespace te::nn
