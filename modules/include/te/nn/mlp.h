#pragma once

// te::nn::LayerNormMLP: Transformer Engine's LayerNormMLP (norm, fc1, activation(s), dropout,
// fc2) in LibTorch's module idiom.

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include "te/nn/dense.h"
#include "te/nn/functional.h"
#include "te/nn/sharded.h"

namespace te::nn {

/// Options for LayerNormMLP(hidden, ffn_hidden).
///
/// Example:
///   te::nn::LayerNormMLP mlp(te::nn::LayerNormMLPOptions(256, 1024).activations({"gelu"}));
struct LayerNormMLPOptions {
  LayerNormMLPOptions(int64_t hidden_size, int64_t ffn_hidden_size)
      : hidden_size_(hidden_size), ffn_hidden_size_(ffn_hidden_size), layernorm_(hidden_size) {}
  TORCH_ARG(int64_t, hidden_size);
  TORCH_ARG(int64_t, ffn_hidden_size);
  /// The norm in front (its hidden_size must equal hidden_size).
  TORCH_ARG(LayerNormOptions, layernorm);
  /// One per fc1 output slot, multiplied together (TE-JAX's lists): {"relu"}, {"gelu"}, gated
  /// {"gelu", "linear"}, {"silu", "linear"}; or one TE-PyTorch name, gated ones taking two slots:
  /// {"swiglu"}, {"geglu"}, {"clamped_swiglu"}, ... (functional::activation_slots).
  TORCH_ARG(std::vector<std::string>, activations) = {"relu"};
  /// clamped_swiglu's limit, alpha and glu_linear_offset (TE's activation_params).
  TORCH_ARG(functional::ActivationParams, activation_params) = {};
  /// Dropout on the activation output (training only).
  TORCH_ARG(double, intermediate_dropout_rate) = 0.1;
  TORCH_ARG(bool, use_bias) = false;
  /// fc1 kernel (hidden, activations, ffn) and fc2 kernel (ffn, hidden) logical axes.
  TORCH_ARG(LogicalAxes, kernel_axes_1) = axis::joined_in_kernel();
  TORCH_ARG(LogicalAxes, kernel_axes_2) = axis::out_kernel();
  TORCH_ARG(LogicalAxes, bias_axes_1) = {axis::kWJoined, axis::kWTp};
  TORCH_ARG(LogicalAxes, bias_axes_2) = axis::replicated_1d();
  /// Constraints on the norm's input, fc1's input, fc2's input and the output; empty: none.
  TORCH_ARG(LogicalAxes, layernorm_input_axes) = {};
  TORCH_ARG(LogicalAxes, dot_1_input_axes) = {};
  TORCH_ARG(LogicalAxes, dot_2_input_axes) = {};
  TORCH_ARG(LogicalAxes, output_axes) = {};
};

class LayerNormMLPImpl : public torch::nn::Cloneable<LayerNormMLPImpl>, public ShardedModule {
 public:
  LayerNormMLPImpl(int64_t hidden_size, int64_t ffn_hidden_size)
      : LayerNormMLPImpl(LayerNormMLPOptions(hidden_size, ffn_hidden_size)) {}
  explicit LayerNormMLPImpl(const LayerNormMLPOptions& options);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  at::Tensor forward(const at::Tensor& input);
  DTensor forward(const DTensor& input);
  /// The output and the norm's output (TE's return_layernorm_output: the residual of a layer
  /// with apply_residual_connection_post_layernorm).
  std::pair<at::Tensor, at::Tensor> forward_with_layernorm_output(const at::Tensor& input);
  std::pair<DTensor, DTensor> forward_with_layernorm_output(const DTensor& input);
  std::vector<Fp8Gemm> fp8_gemms() override;

  LayerNormMLPOptions options;
  LayerNorm layernorm{nullptr};
  at::Tensor wi_kernel, wi_bias, wo_kernel, wo_bias;
  /// FP8 state of the two GEMMs (buffers wi_fp8_*, wo_fp8_*).
  std::shared_ptr<fp8::GemmMeta> wi_fp8, wo_fp8;

 protected:
  void forget_member(const std::string& name) override;
};
TE_MODULE(LayerNormMLP);

}  // namespace te::nn
