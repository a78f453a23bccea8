#pragma once

// Parameters with logical axes: a te::nn module registers each parameter with its axes; built
// while a mesh and rules (or a MeshResource) are in scope, it keeps only this rank's shard.

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "te/distributed/dtensor.h"
#include "te/fp8.h"
#include "te/nn/block_weights.h"
#include "te/sharding/axis_rules.h"

/// Like TORCH_MODULE, for te::nn modules whose forward takes an at::Tensor or a te::DTensor:
/// `module(x)` calls the matching overload (LibTorch's holder cannot see overloaded forwards).
#define TE_MODULE(Name)                                                                    \
  class Name : public torch::nn::ModuleHolder<Name##Impl> { /* NOLINT */                   \
   public:                                                                                 \
    using torch::nn::ModuleHolder<Name##Impl>::ModuleHolder;                               \
    using Impl = Name##Impl;                                                               \
    at::Tensor operator()(const at::Tensor& input) { return get()->forward(input); }       \
    ::te::DTensor operator()(const ::te::DTensor& input) { return get()->forward(input); } \
  }

namespace te::nn {

/// How one parameter is laid out: its logical axes, its global shape, and, when the module is
/// sharded, the mesh and placements of the local shard the module holds.
struct ParameterLayout {
  LogicalAxes axes;
  std::vector<int64_t> global_shape;
  std::optional<DeviceMesh> mesh;
  std::vector<Placement> placements;
};

/// Base of te::nn module implementations (next to torch::nn::Cloneable).
class ShardedModule {
 public:
  virtual ~ShardedModule() = default;

  /// Layouts of this module's own parameters, by name.
  const std::map<std::string, ParameterLayout>& parameter_layouts() const { return layouts_; }

  /// True when some parameter is sharded over more than one rank.
  bool is_sharded() const;

  /// Lays this module's own whole parameters out on `mesh` under the rules in scope (keeping
  /// this rank's pieces); see shard_module.
  void shard_own_parameters(torch::nn::Module& self, const DeviceMesh& mesh);
  /// Collective: makes this module's own sharded parameters whole again; see gather_module.
  void gather_own_parameters(torch::nn::Module& self);

  /// The FP8 state of one of this module's GEMMs (te::fp8::GemmMeta), bound to `self`: its six
  /// tensors registered as <prefix>fp8_{fwd,bwd}_{scale,scale_inv,amax_history} (so saved, loaded
  /// and cloned with it), and it records amaxes while `self` trains.
  std::shared_ptr<fp8::GemmMeta> register_fp8_gemm(torch::nn::Module& self,
                                                   const std::string& prefix);

  /// One GEMM whose kernel freeze_fp8_weights can hold in FP8: the kernel parameter's name, the
  /// parameter (the module's own tensor, undefined once released), and the GEMM's FP8 state.
  struct Fp8Gemm {
    std::string kernel_name;
    at::Tensor kernel;
    std::shared_ptr<fp8::GemmMeta> meta;
  };
  /// This module's own FP8-capable GEMMs (none by default).
  virtual std::vector<Fp8Gemm> fp8_gemms() { return {}; }

  /// Removes parameter `name` from `self`, from the layouts and from the member that held it
  /// (forget_member), so its memory goes with the last reference outside the module: for weights
  /// now held in another form (FP8 codes, GGUF blocks).
  void release_parameter(torch::nn::Module& self, const std::string& name);

  /// A parameter held in ggml blocks instead (GGUF weights, see block_weights.h): the matrix, the
  /// parameter's shape, and whether the parameter is the matrix transposed (a kernel [in,
  /// out...], whose out dims flatten into the matrix's rows) or the matrix itself (a table).
  struct HeldBlocks {
    std::shared_ptr<const BlockMatrix> matrix;
    std::vector<int64_t> shape;
    bool transposed = true;
    /// > 0: the parameter is a mixture's stacked kernels [experts, in, out...] and the matrix
    /// holds each expert's out rows, expert by expert (transposed).
    int64_t experts = 0;
  };
  /// Holds parameter `name` of `self` as `held` and releases it (release_parameter). te::Error
  /// naming the parameter when the matrix's shape is not the parameter's, or the parameter is
  /// sharded (blocks serve on one process).
  void hold_blocks(torch::nn::Module& self, const std::string& name, HeldBlocks held);
  /// The blocks `name` is held in, or nullptr.
  const HeldBlocks* held_blocks(const std::string& name) const;
  /// Every parameter held in blocks, by name.
  const std::map<std::string, HeldBlocks>& all_held_blocks() const { return blocks_; }

  /// The registered parameter `local` as a DTensor on `mesh`: its own layout when sharded there,
  /// Replicate when the module holds it whole.
  DTensor as_dtensor(const std::string& name, const at::Tensor& local,
                     const DeviceMesh& mesh) const;

 protected:
  /// Clears the member that holds parameter `name` (release_parameter calls it). Modules whose
  /// weights can be held in another form override it; by default a release is refused.
  virtual void forget_member(const std::string& name);

  /// Registers `name` on `self` from the whole initial value `full` (the same on every rank).
  /// With a mesh in scope and a constraint resolved for `axes` (rules or TE table), keeps this
  /// rank's shard; otherwise the whole tensor. A clone reuses the original's layout.
  at::Tensor register_sharded(torch::nn::Module& self, const std::string& name, at::Tensor full,
                              LogicalAxes axes);

 private:
  std::map<std::string, ParameterLayout> layouts_;
  std::map<std::string, HeldBlocks> blocks_;
};

/// Every parameter's logical axes in `module` and its children, by the names named_parameters()
/// uses.
std::map<std::string, LogicalAxes> named_parameter_axes(const torch::nn::Module& module);

/// Sets parameter `name` (as named_parameters() names it) from its whole value `global`, the same
/// on every rank: a sharded module keeps this rank's piece. Not differentiable (a load).
void set_parameter_from_global(torch::nn::Module& module, const std::string& name,
                               const at::Tensor& global);

/// Shards a module built whole (on one process, or loaded) onto `mesh`: every te::nn parameter
/// is laid out by its logical axes under the rules (or MeshResource) in scope, and this rank
/// keeps its piece. Every rank calls it with the same whole weights.
void shard_module(torch::nn::Module& module, const DeviceMesh& mesh);

/// Collective: gathers every sharded te::nn parameter of `module` back to its whole value on
/// every rank (e.g. to save it with torch::save).
void gather_module(torch::nn::Module& module);

/// What validate_sharding found.
struct ShardingReport {
  /// Parameter dims whose mesh axes do not divide them (torch.chunk would give uneven pieces).
  std::vector<std::string> uneven;
  /// Parameter logical axes that no rule in scope names.
  std::vector<std::string> unmatched;
  bool ok() const { return uneven.empty() && unmatched.empty(); }
  std::string to_string() const;
};

/// Checks every te::nn parameter of `module` (and its children) against its mesh layout, or the
/// current mesh and rules when it is whole: lists every dim its mesh axes do not divide and
/// every logical axis no rule names, all in one report.
ShardingReport check_sharding(const torch::nn::Module& module);

/// Throws te::Error carrying the whole report when check_sharding finds anything.
void validate_sharding(const torch::nn::Module& module);

/// Every parameter's layout in `module` and its children, by the names named_parameters() uses.
std::map<std::string, ParameterLayout> named_parameter_layouts(const torch::nn::Module& module);

}  // namespace te::nn
