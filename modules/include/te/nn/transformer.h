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
#include "te/nn/moe_layer.h"

namespace te::nn {

/// Options for TransformerLayer(hidden, ffn_hidden, heads).
///
/// Example (BERT's post-LN encoder layer: a padding mask, GELU):
///   auto o = te::nn::TransformerLayerOptions(256, 1024, 8)
///                .mlp_activations({"gelu"})
///                .apply_residual_connection_post_layernorm(true)
///                .output_layernorm(true);
///   o.self_attention().attention().attn_mask_type(te::nn::AttnMaskType::kPadding);
///   te::nn::TransformerLayer layer(o);
struct TransformerLayerOptions {
  TransformerLayerOptions(int64_t hidden_size, int64_t mlp_hidden_size, int64_t num_attention_heads)
      : hidden_size_(hidden_size),
        mlp_hidden_size_(mlp_hidden_size),
        self_attention_(hidden_size, num_attention_heads) {
    self_attention_.attention().attention_dropout(0.1);  // TE's TransformerLayer default
  }
  TORCH_ARG(int64_t, hidden_size);
  TORCH_ARG(int64_t, mlp_hidden_size);
  /// The self attention's options (its module `self_attention`), with the core attention's
  /// nested as `.attention()`: there TE's TransformerLayer arguments self_attn_mask_type,
  /// window_size, bottom_right_diagonal, attn_input_format (qkv_format), attention_dropout,
  /// softmax_type, num_gqa_groups and kv_channels (head_dim); here qk_norm_*, qkv_bias, fuse_qkv,
  /// the kernel axes, scaled_query_init, scale_attn_logits, rotary_pos_interleaved. Three of its
  /// fields are the layer's: `layernorm` is the layer's norm (TE's normalization,
  /// layernorm_epsilon, zero_centered_gamma), which the MLP's and output_layernorm's norms copy;
  /// `use_bias` is TE's bias, for the MLP too unless mlp_bias; `enable_sequence_parallel` shards
  /// the whole layer's activations on seqlen. The layer sets `input_layernorm` (off with
  /// output_layernorm). A decoder's cross attention is these options with self_attention false,
  /// attn_mask_type padding, no window, and query/key-value kernel axes derived from
  /// qkv_kernel_axes (its first and last axes; all three).
  TORCH_ARG(MultiHeadAttentionOptions, self_attention);
  /// "encoder" or "decoder" (adds cross attention to the encoder's output).
  TORCH_ARG(std::string, layer_type) = "encoder";
  /// Dropout after each block, before the residual add (training only); the attention's own
  /// (self_attention().attention().attention_dropout()) is 0.1 here too, as TE's.
  TORCH_ARG(double, hidden_dropout) = 0.1;
  TORCH_ARG(double, intermediate_dropout) = 0.1;
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
  /// A norm on the self attention's and on the MLP's output, before the dropout and the residual
  /// add (modules post_attention_layernorm and post_mlp_layernorm, with the layer's norm
  /// options): the "sandwich" of Gemma 2 and 3 (transformers 5.23.0
  /// models/gemma2/modeling_gemma2.py Gemma2DecoderLayer: post_attention_layernorm,
  /// post_feedforward_layernorm). Encoders without parallel_attention_mlp.
  TORCH_ARG(bool, post_block_layernorm) = false;
  /// Stochastic depth on the self attention's and the MLP's branch (functional::drop_path).
  TORCH_ARG(double, drop_path_rate) = 0.0;
  /// Biases on the MLP's two projections (Llama's mlp_bias); nullopt: the attention's use_bias.
  TORCH_ARG(std::optional<bool>, mlp_bias) = std::nullopt;
  /// A mixture of experts in place of the MLP (module `moe`, a LayerNormMoE; `mlp` is then
  /// null): its experts, router, activations, biases and shared expert as given; its norm is the
  /// layer's and its constraints the MLP's (hidden_size must be the layer's).
  TORCH_ARG(std::optional<LayerNormMoEOptions>, moe) = std::nullopt;
  /// MLP kernel logical axes: fc1 (hidden, activations, ffn) and fc2 (ffn, hidden).
  TORCH_ARG(LogicalAxes, mlp_kernel_axes_1) = axis::joined_in_kernel();
  TORCH_ARG(LogicalAxes, mlp_kernel_axes_2) = axis::out_kernel();
};

/// x -> x + drop(attn(ln(x))) [-> + drop(cross_attn(ln(.), memory))] -> + drop(mlp(ln(.))), or
/// the post-LN, parallel and post-block-norm structures the options choose.
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
  /// options.moe: the mixture of experts in the MLP's place (else null).
  LayerNormMoE moe{nullptr};
  /// output_layernorm: the norm after the layer (else null).
  LayerNorm layernorm{nullptr};
  /// post_block_layernorm: the norms of the self attention's and the MLP's outputs (else null).
  LayerNorm post_attention_layernorm{nullptr}, post_mlp_layernorm{nullptr};
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
