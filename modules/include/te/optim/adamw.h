#pragma once

// AdamW over te::nn parameters, with fp32 master weights for bfloat16 and float16 ones, and the
// parameter groups that leave norms and biases out of weight decay.
//
// The update is torch.optim.AdamW's (decoupled weight decay), op for op as its single-tensor path
// runs it on CPU (torch 2.11 torch/optim/adam.py _single_tensor_adam): the weight scaled by
// 1 - lr * weight_decay, exp_avg.lerp_(g, 1 - beta1), exp_avg_sq.mul_(beta2).addcmul_(g, g,
// 1 - beta2), then weight.addcdiv_(exp_avg, exp_avg_sq.sqrt() / sqrt(1 - beta2^t) + eps,
// -lr / (1 - beta1^t)), with the bias corrections in double. LibTorch's torch::optim::AdamW
// differs in the last bit (mul_ + add_ for the first moment, as torch 1.13 did).
//
// Master weights, as Transformer Engine's FusedAdam(master_weights=True) keeps them
// (transformer_engine/pytorch/optimizers/fused_adam.py at d0067d0): a bfloat16 or float16
// parameter gets an fp32 copy, created at its first step from the parameter; the moments are
// fp32; the gradient is read in fp32 and the update runs on the copy, which is then rounded to
// nearest into the parameter. So given the same gradients a bf16 run updates as an fp32 one, and
// the bf16 weights are exactly the masters rounded. A parameter gets its state at its first step
// with a gradient.
//
// Parameters of te::nn modules are each rank's local pieces: the state of each is laid out as
// its parameter (a parameter sharded over the data axis, FSDP, has its state sharded alike:
// ZeRO-3), and the update being element-wise, every layout steps like one process.
//
// ZeRO-1 (ZeroSharding: Rajbhandari et al. 2020; torch's ZeroRedundancyOptimizer, Megatron-LM's
// distributed optimizer): a parameter replicated over the data axis has its moments and master
// split over that axis's ranks instead, each rank holding one torch.chunk of the parameter's
// flattened local piece (balanced to an element, as Megatron splits its flat buffers); each
// rank updates its chunk from the whole (all-reduced) gradient, and the updated chunks are
// all-gathered into the parameter, in its dtype. State memory per rank falls by the axis size;
// the parameters equal the unsharded step's. Checkpoints hold the state whole (so they load on
// any layout): save_checkpoint and load_checkpoint gather it for their duration, so their peak
// is the unsplit state's.
//
// Example:
//   te::optim::AdamW optimizer(*model, te::optim::AdamWOptions(3e-4).betas({0.9, 0.95})
//                                          .weight_decay(0.1));  // norms and biases: none
//   loss.backward();
//   te::optim::clip_grad_norm(*model, 1.0);
//   optimizer.step();
//   te::nn::save_checkpoint(*model, "ckpt", "{}", &optimizer);  // the state and masters too

#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "te/distributed/mesh.h"
#include "te/distributed/placement.h"

namespace te::optim {

struct AdamWOptions : public torch::optim::OptimizerCloneableOptions<AdamWOptions> {
  AdamWOptions(double lr = 1e-3) : lr_(lr) {}  // NOLINT: implicit, as torch's options are
  TORCH_ARG(double, lr) = 1e-3;
  using betas_t = std::tuple<double, double>;
  TORCH_ARG(betas_t, betas) = std::make_tuple(0.9, 0.999);
  TORCH_ARG(double, eps) = 1e-8;
  /// Decoupled weight decay, torch.optim.AdamW's default.
  TORCH_ARG(double, weight_decay) = 1e-2;
  /// fp32 master weights for bfloat16 and float16 parameters (fp32 ones need none).
  TORCH_ARG(bool, master_weights) = true;

  double get_lr() const override { return lr_; }
  void set_lr(const double lr) override { lr_ = lr; }
};

/// One parameter's state. The step counts this parameter's updates (torch keeps one per
/// parameter too).
struct AdamWParamState : public torch::optim::OptimizerCloneableParamState<AdamWParamState> {
  TORCH_ARG(int64_t, step) = 0;
  /// The moments: fp32 beside a master, else in the parameter's dtype (torch's); its shape.
  TORCH_ARG(at::Tensor, exp_avg);
  TORCH_ARG(at::Tensor, exp_avg_sq);
  TORCH_ARG(at::Tensor, master);  ///< fp32 copy of a low-precision parameter, else undefined
};

/// Whether a parameter stays out of weight decay, given its name (as named_parameters gives it)
/// and its global shape (the whole tensor's, whatever the layout).
using NoDecayRule = std::function<bool(const std::string& name, const std::vector<int64_t>&)>;

/// The default rule: no decay for a parameter of fewer than two dimensions (norm scales,
/// biases, softmax offsets) or whose last name component ends in "bias" (te's 2-D qkv_bias,
/// kv_bias, wi_bias): Megatron-LM's default (megatron/core/optimizer/__init__.py,
/// get_standard_config_overrides: "*.bias" and 1-D parameters) on te's parameter names.
/// Kernels and embeddings are decayed.
bool default_no_decay(const std::string& name, const std::vector<int64_t>& global_shape);

/// ZeRO-1: the state of parameters replicated over mesh axis `axis` (the data axis) split over
/// its ranks. A parameter sharded over `axis` (FSDP) keeps its state laid out as itself.
struct ZeroSharding {
  DeviceMesh mesh;
  std::string axis;
};

class AdamW : public torch::optim::Optimizer {
 public:
  /// te::Error naming the option for a negative lr, eps or weight_decay, or a beta outside
  /// [0, 1) (in `defaults` or a group's own options, which must be AdamWOptions), and for a
  /// parameter given twice.
  explicit AdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                 AdamWOptions defaults = {});
  explicit AdamW(std::vector<at::Tensor> params, AdamWOptions defaults = {});
  /// Over `module`'s trainable parameters in weight_decay_groups(module, defaults, no_decay).
  /// With `zero`, the state of each parameter replicated over zero->axis is split over that
  /// axis (ZeRO-1); te::Error naming the axis when the mesh has none such, or a parameter laid
  /// out on another mesh. step() is then collective over the axis.
  AdamW(const torch::nn::Module& module, const AdamWOptions& defaults,
        const NoDecayRule& no_decay = default_no_decay,
        std::optional<ZeroSharding> zero = std::nullopt);

  /// One update of every parameter that has a gradient (the closure, if any, is called first
  /// with gradients enabled, and its loss returned). te::Error naming the parameter for a sparse
  /// gradient or one whose shape or dtype differs from the parameter's, and for a parameter
  /// that is in none of the groups.
  at::Tensor step(LossClosure closure = nullptr) override;

  /// The state of `param` (one of this optimizer's), created as its first step would create it
  /// when `create` is set and it has none yet (nullptr otherwise). For checkpoints.
  AdamWParamState* state_of(const at::Tensor& param, bool create);

  /// This rank's chunk of a ZeRO-split parameter's state, as the element range [offset, offset
  /// + length) of the flattened parameter (its state tensors are that long and one-dimensional);
  /// nullopt for a parameter whose state is laid out as itself.
  struct Piece {
    int64_t offset = 0, length = 0;
  };
  std::optional<Piece> state_piece(const at::Tensor& param) const;
  /// A state tensor of ZeRO-split `param` (this rank's chunk) made whole and shaped as the
  /// parameter: collective over the ZeRO axis. For checkpoints.
  at::Tensor gather_state(const at::Tensor& param, const at::Tensor& chunk) const;

  /// torch::serialize archives would leave the masters' layout out: te::Error saying to use
  /// te::nn::save_checkpoint / load_checkpoint with this optimizer.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

 private:
  struct Split {
    Piece piece;
    int64_t numel = 0;
    std::vector<Placement> placements;  ///< of the flattened piece: Shard(0) on the ZeRO axis
  };
  void split_state(const torch::nn::Module& module, const ZeroSharding& zero);
  /// The whole flattened parameter from every rank's updated chunk (collective).
  at::Tensor gather(const Split& split, const at::Tensor& chunk) const;

  std::optional<DeviceMesh> zero_mesh_;
  std::map<const void*, Split> splits_;  ///< by the parameter's TensorImpl
};

/// `module`'s trainable parameters in two groups, each with `options`: those decayed (by
/// options.weight_decay()) and those `no_decay` keeps out (weight decay 0); an empty group is
/// left out. The module must be held by a shared_ptr (as te::nn modules are: ModuleHolder or
/// std::make_shared) for the parameters' layouts to be read.
std::vector<torch::optim::OptimizerParamGroup> weight_decay_groups(
    const torch::nn::Module& module, const AdamWOptions& options,
    const NoDecayRule& no_decay = default_no_decay);

}  // namespace te::optim
