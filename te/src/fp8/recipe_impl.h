#pragma once

// The internal interface every FP8 recipe implements, and the autocast state the recipes share
// (docs/ARCHITECTURE.md §5). One file per recipe: delayed.cpp, current.cpp, block.cpp, mxfp8.cpp,
// nvfp4.cpp; the names are registered in recipe.cpp.

#include <ATen/Tensor.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "te/distributed/mesh.h"
#include "te/distributed/scopes.h"
#include "te/fp8.h"

namespace te::fp8 {

struct Region;
struct BackwardReduction;

/// One FP8 GEMM y = x @ w as its recipe sees it.
struct GemmCall {
  std::shared_ptr<GemmMeta> meta;
  std::optional<DeviceMesh> mesh;  ///< none: one process
  std::vector<int64_t> dims;       ///< the mesh dims a whole tensor's amax is reduced over
  bool record = true;              ///< records(meta) when the GEMM ran
  Region* region = nullptr;        ///< the innermost autocast region (forward only)
  std::shared_ptr<BackwardReduction> backward;  ///< the outermost region's (delayed scaling)
};

/// The casts one GEMM's forward makes, each blocked along the dim its GEMM contracts:
/// x [M, K] and w_t [N, K] for y = x w; x_t [K, M] for wgrad = x^T g; w [K, N] for dgrad = g w^T.
struct ForwardCasts {
  Fp8Tensor x, w_t, x_t, w;
};

/// The casts of the output gradient g [M, N]: g (along N) for dgrad, g_t [N, M] (along M) for
/// wgrad.
struct GradCasts {
  Fp8Tensor g, g_t;
};

/// A recipe's behaviour. Stateless itself (its settings are fixed when made); whatever it keeps
/// between steps lives in the GEMM's GemmMeta.
class RecipeImpl {
 public:
  virtual ~RecipeImpl() = default;
  /// recipe_named's name.
  virtual std::string name() const = 0;
  virtual std::string to_string() const = 0;
  virtual Format format() const = 0;
  /// x [M, K] and w [K, N], high precision, this rank's pieces.
  virtual ForwardCasts cast_forward(const at::Tensor& x, const at::Tensor& w,
                                    GemmCall& call) const = 0;
  virtual GradCasts cast_grad(const at::Tensor& g, GemmCall& call) const = 0;
  /// FP8 weights in training (hold_kernel): x [M, K] alone cast as cast_forward casts it, for a
  /// GEMM whose kernel is held quantized (returned as ForwardCasts' x and x_t). Per-tensor recipes;
  /// the others throw te::Error naming themselves (the default).
  virtual ForwardCasts cast_input(const at::Tensor& x, GemmCall& call) const;
  /// The scale a held kernel takes from its whole amax (fp32 [1]); the default throws as
  /// cast_input's does.
  virtual at::Tensor weight_scale(const at::Tensor& amax) const;
  /// Whether the forward GEMM may accumulate in the tensor cores' reduced precision (TE's
  /// use_split_accumulator = false): per-tensor recipes yes, block recipes no.
  virtual bool fast_forward_accumulation() const { return true; }
  /// A calibrating region with FP8 off: record what this recipe keeps (DelayedScaling: the
  /// amaxes). Recipes that keep nothing do nothing.
  virtual void calibrate(const at::Tensor& /*x*/, const at::Tensor& /*w*/,
                         GemmCall& /*call*/) const {}
};

// ---- delayed scaling's amax reduction (delayed.cpp) -------------------------------------------

/// A GEMM whose amaxes wait to be reduced (MAX over `dims` of `mesh`) and turned into scales.
struct Pending {
  std::shared_ptr<GemmMeta> meta;
  DelayedScaling recipe;
  std::optional<DeviceMesh> mesh;  // none: one process
  std::vector<int64_t> dims;
};

void add_pending(std::vector<Pending>& list, Pending p);
/// One fused all-reduce (MAX) per (mesh, dims) over every pending GEMM's newest amax row, then
/// each GEMM's DelayedScaling update.
void reduce_and_update(const std::vector<Pending>& items, bool forward);

/// Backward amaxes of the GEMMs of one (outermost) autocast region: reduced and applied by a
/// callback the autograd engine runs when the backward pass ends.
struct BackwardReduction {
  std::mutex mu;
  std::vector<Pending> pending;
  bool queued = false;
  ScopeCapture scopes;  // of the backward that queued the callback (its trace sees the reduce)

  static void add(const std::shared_ptr<BackwardReduction>& self, Pending p);
};

/// One Fp8Autocast region: its switches, the region it nests in, the forward GEMMs whose amaxes
/// its end reduces, and the backward reduction its GEMMs share.
struct Region {
  bool enabled = false;
  bool calibrating = false;
  Recipe recipe;
  std::vector<Pending> forward;
  std::shared_ptr<BackwardReduction> backward;
};

/// This thread's innermost autocast region (null outside one); autocast.cpp keeps the stack.
std::shared_ptr<Region> current_region();
/// The FP8 state stays fp32 whatever the module's dtype (module->to(at::kBFloat16) converts every
/// floating buffer); converted back on use. Call with meta.mutex held.
void keep_fp32(GemmMeta& meta);

// Each recipe's file defines its `implement`, which checks the settings (te::Error naming the
// field) and builds the behaviour; Recipe's constructor calls the one its settings hold.
std::shared_ptr<const RecipeImpl> implement(const DelayedScaling& recipe);
std::shared_ptr<const RecipeImpl> implement(const CurrentScaling& recipe);
std::shared_ptr<const RecipeImpl> implement(const Float8BlockScaling& recipe);
std::shared_ptr<const RecipeImpl> implement(const MXFP8BlockScaling& recipe);
std::shared_ptr<const RecipeImpl> implement(const NVFP4BlockScaling& recipe);

/// The settings check every amax_epsilon gets: te::Error naming `recipe` unless finite and >= 0.
void check_amax_epsilon(const char* recipe, float epsilon);
/// "HYBRID" or "E4M3", as recipes print their format.
const char* format_name(Format format);

/// The fp32 values of codes in a block mode (block.cpp; Fp8Tensor::dequantize's block branch).
at::Tensor dequantize_blocks(const Fp8Tensor& t);
/// The fp32 values of an NVFP4 tensor (nvfp4.cpp).
at::Tensor dequantize_nvfp4(const Fp8Tensor& t);
/// te::Error naming `what` unless x is a 2-D CPU tensor and `scaling` a block mode: 1x128 or
/// 128x128 (Float8BlockScaling's), or also 1x32 with `mx`.
void check_blocked(const at::Tensor& x, ScalingMode scaling, const char* what, bool mx);
/// Its check of x alone: te::Error naming `what` unless x is a 2-D CPU tensor.
void check_block_input(const at::Tensor& x, const char* what);

/// x's whole-tensor amax, reduced (MAX) over call.dims of call.mesh: what a rank holding a piece
/// needs to cast as one process would.
at::Tensor reduced_amax(const at::Tensor& x, const GemmCall& call);

}  // namespace te::fp8
