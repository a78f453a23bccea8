#pragma once

// te::nn::GroupedLinear: Transformer Engine's GroupedLinear (module/grouped_linear.py at
// d0067d0da, forward(inp, m_splits)): one linear map per group of consecutive rows, the
// experts of a mixture of experts applied to tokens grouped by expert (te/nn/moe.h's
// moe_permute). The kernels are one [groups, in, out] parameter, the expert dim first, as
// TE-JAX's MoE keeps them.

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <vector>

#include "te/fp8.h"
#include "te/nn/sharded.h"

namespace te::nn {

namespace functional {

/// Rows [M, in] split into groups of m_splits rows (summing to M), group g through kernel[g]
/// ([groups, in, out]) and bias[g] ([groups, out], optional): [M, out]. One autograd node for
/// every group (each group's GEMM written into its rows of one output; backward the same),
/// which is what makes many small groups cheap: a loop of per-group dense calls pays an
/// autograd node, a slice and a concatenation per group. With fp8 (one GemmMeta per group)
/// inside an enabled or calibrating te::Fp8Autocast each group's GEMM runs under the recipe
/// with its own scaling, as TE's per-GEMM quantizers. On a mesh (`mesh`, `amax_dims`: the dims
/// the groups' amaxes reduce over, fp8::linear's) every group runs, one of no rows included, so
/// that the ranks of those dims make the same reductions in the same order.
at::Tensor grouped_dense(const at::Tensor& x, const at::Tensor& kernel,
                         const std::vector<int64_t>& m_splits, const at::Tensor& bias = {},
                         const std::vector<std::shared_ptr<fp8::GemmMeta>>& fp8 = {},
                         const DeviceMesh* mesh = nullptr,
                         const std::vector<int64_t>* amax_dims = nullptr);

}  // namespace functional

/// Options for GroupedLinear: num_gemms kernels of shape (in, out) and optional biases (out).
///
/// Example:
///   te::nn::GroupedLinear experts(te::nn::GroupedLinearOptions(8, 256, 1024));
///   at::Tensor y = experts(permuted.tokens, permuted.rows_per_expert);
struct GroupedLinearOptions {
  GroupedLinearOptions(int64_t num_gemms, int64_t in_features, int64_t out_features)
      : num_gemms_(num_gemms), in_features_(in_features), out_features_(out_features) {}
  TORCH_ARG(int64_t, num_gemms);
  TORCH_ARG(int64_t, in_features);
  TORCH_ARG(int64_t, out_features);
  /// Whether to add learned biases (initialised to zero).
  TORCH_ARG(bool, use_bias) = true;
  /// Logical axes of the kernel (groups, in, out), e.g. {"exp", "embed", "mlp"}; empty: not
  /// sharded.
  TORCH_ARG(LogicalAxes, kernel_axes) = {};
  /// Logical axes of the bias (groups, out); empty: not sharded.
  TORCH_ARG(LogicalAxes, bias_axes) = {};
};

/// y[rows of group g] = x[rows of group g] @ kernel[g] + bias[g]. Each kernel is initialised as
/// Dense's (variance_scaling(1, fan_in, truncated_normal) over its own (in, out)), in group
/// order, from te::nn::manual_seed's generator. Each group's GEMM has its own FP8 state
/// (buffers fp8_<g>_{fwd,bwd}_...).
class GroupedLinearImpl : public torch::nn::Cloneable<GroupedLinearImpl>, public ShardedModule {
 public:
  GroupedLinearImpl(int64_t num_gemms, int64_t in_features, int64_t out_features)
      : GroupedLinearImpl(GroupedLinearOptions(num_gemms, in_features, out_features)) {}
  explicit GroupedLinearImpl(const GroupedLinearOptions& options);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;
  /// input [M, in] (or [..., in], flattened to rows) with m_splits rows per group.
  at::Tensor forward(const at::Tensor& input, const std::vector<int64_t>& m_splits);

  GroupedLinearOptions options;
  at::Tensor kernel;  ///< [num_gemms, in, out]
  at::Tensor bias;    ///< [num_gemms, out] or undefined
  std::vector<std::shared_ptr<fp8::GemmMeta>> fp8_metas;
};
TORCH_MODULE(GroupedLinear);

}  // namespace te::nn
