#pragma once

// te::nn::Dense, LayerNorm and LayerNormDense: Transformer Engine's DenseGeneral, LayerNorm and
// LayerNormDenseGeneral in LibTorch's module idiom. Each forwards a plain at::Tensor (one device)
// and a te::DTensor (any mesh).

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <optional>
#include <string>
#include <utility>

#include "te/fp8.h"
#include "te/nn/sharded.h"

namespace te::nn {

/// Options for Dense: a kernel of shape (in, out) and an optional bias (out).
///
/// Example:
///   te::nn::Dense fc(te::nn::DenseOptions(256, 1024).kernel_axes({"w_fsdp", "w_tp"}));
struct DenseOptions {
  DenseOptions(int64_t in_features, int64_t out_features)
      : in_features_(in_features), out_features_(out_features) {}
  /// Size of the input's last dim.
  TORCH_ARG(int64_t, in_features);
  /// Size of the output's last dim.
  TORCH_ARG(int64_t, out_features);
  /// Whether to add a learned bias (initialised to zero).
  TORCH_ARG(bool, use_bias) = true;
  /// Logical axes of the kernel (in, out); empty: not sharded.
  TORCH_ARG(LogicalAxes, kernel_axes) = {};
  /// Logical axes of the bias (out); empty: not sharded.
  TORCH_ARG(LogicalAxes, bias_axes) = {};
  /// Constraint on the input; empty: none.
  TORCH_ARG(LogicalAxes, input_axes) = {};
  /// Constraint on the output; empty: none.
  TORCH_ARG(LogicalAxes, output_axes) = {};
};

/// y = x @ kernel + bias over the last dim of x. The kernel is initialised with TE's default,
/// variance_scaling(1, fan_in, truncated_normal), from te::nn::manual_seed's generator.
class DenseImpl : public torch::nn::Cloneable<DenseImpl>, public ShardedModule {
 public:
  DenseImpl(int64_t in_features, int64_t out_features)
      : DenseImpl(DenseOptions(in_features, out_features)) {}
  explicit DenseImpl(const DenseOptions& options);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  at::Tensor forward(const at::Tensor& input);
  DTensor forward(const DTensor& input);
  /// forward with `input_axes` in place of options().input_axes() (LayerNormDense's dot input).
  at::Tensor project(const at::Tensor& input, const LogicalAxes& input_axes);
  DTensor project(const DTensor& input, const LogicalAxes& input_axes);
  std::vector<Fp8Gemm> fp8_gemms() override;

  DenseOptions options;
  at::Tensor kernel;
  at::Tensor bias;
  /// The kernel GEMM's FP8 state (buffers fp8_{fwd,bwd}_{scale,scale_inv,amax_history}).
  std::shared_ptr<fp8::GemmMeta> fp8_meta;

 protected:
  void forget_member(const std::string& name) override;
};
TE_MODULE(Dense);

/// Options for LayerNorm over a hidden dim of `hidden_size`.
struct LayerNormOptions {
  explicit LayerNormOptions(int64_t hidden_size) : hidden_size_(hidden_size) {}
  TORCH_ARG(int64_t, hidden_size);
  /// "layernorm" or "rmsnorm".
  TORCH_ARG(std::string, layernorm_type) = "layernorm";
  TORCH_ARG(double, epsilon) = 1e-6;
  /// Learn gamma - 1 (initialised to zero) instead of gamma (initialised to one).
  TORCH_ARG(bool, zero_centered_gamma) = false;
  TORCH_ARG(LogicalAxes, scale_axes) = axis::replicated_1d();
  TORCH_ARG(LogicalAxes, bias_axes) = axis::replicated_1d();
};

/// Layer (or RMS) normalisation over the last dim, with learned scale ("scale") and, for
/// layernorm, bias ("ln_bias").
class LayerNormImpl : public torch::nn::Cloneable<LayerNormImpl>, public ShardedModule {
 public:
  explicit LayerNormImpl(int64_t hidden_size) : LayerNormImpl(LayerNormOptions(hidden_size)) {}
  explicit LayerNormImpl(const LayerNormOptions& options);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  at::Tensor forward(const at::Tensor& input);
  DTensor forward(const DTensor& input);

  LayerNormOptions options;
  at::Tensor scale;
  at::Tensor ln_bias;
};
TE_MODULE(LayerNorm);

/// Options for LayerNormDense: LayerNorm in front of Dense.
struct LayerNormDenseOptions {
  LayerNormDenseOptions(int64_t in_features, int64_t out_features)
      : layernorm_(in_features), dense_(in_features, out_features) {}
  TORCH_ARG(LayerNormOptions, layernorm);
  TORCH_ARG(DenseOptions, dense);
  /// Also return the normalised input (forward_with_layernorm_output).
  TORCH_ARG(bool, return_layernorm_output) = false;
  /// Constraint on the input of the norm; empty: none.
  TORCH_ARG(LogicalAxes, layernorm_input_axes) = {};
  /// Constraint on the input of the matmul (the norm's output); empty: none.
  TORCH_ARG(LogicalAxes, dot_input_axes) = {};
};

class LayerNormDenseImpl : public torch::nn::Cloneable<LayerNormDenseImpl>, public ShardedModule {
 public:
  LayerNormDenseImpl(int64_t in_features, int64_t out_features)
      : LayerNormDenseImpl(LayerNormDenseOptions(in_features, out_features)) {}
  explicit LayerNormDenseImpl(const LayerNormDenseOptions& options);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  at::Tensor forward(const at::Tensor& input);
  DTensor forward(const DTensor& input);
  /// The output and, when return_layernorm_output is set, the normalised input.
  std::pair<at::Tensor, std::optional<at::Tensor>> forward_with_layernorm_output(
      const at::Tensor& input);
  std::pair<DTensor, std::optional<DTensor>> forward_with_layernorm_output(const DTensor& input);

  LayerNormDenseOptions options;
  LayerNorm layernorm{nullptr};
  Dense dense{nullptr};
};
TE_MODULE(LayerNormDense);

}  // namespace te::nn
