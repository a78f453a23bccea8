#pragma once

// One forward body per module (internal). Each module's forward is one function template over
// the tensor type, instantiated for at::Tensor (one device: the module holds whole parameters)
// and for DTensor (any mesh: the layouts follow from placements). The few things that differ
// between the two live here, once, as overloads the bodies call:
//   - a parameter as the forward's tensor type (param, param_or_none);
//   - a projection: x @ kernel + bias between two constraints (project): on one device the
//     bias goes into the GEMM and the constraints only check their axes; on a mesh the input
//     constraint is folded into the matmul's redistribution and the bias is added after the
//     output constraint, so a partial product reduces straight into the requested layout;
//   - what a plain forward refuses (enter: a module holding only its shards) and how a shape
//     reads in an error (shape_of);
//   - a cross attention's memory (Memory<T>: an undefined at::Tensor or std::nullopt for none).
// An option written into a module body is therefore written once for both, and the
// at::Tensor instantiation does what the hand-written one-device forward did (bench/
// bench_one_forward measures te-serve's 32-token forward against the commit before this one).

#include <ATen/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>

#include "constrain.h"
#include "te/distributed/dtensor.h"
#include "te/nn/functional.h"
#include "te/nn/sharded.h"

namespace te::nn::detail {

template <typename T>
inline constexpr bool kPlain = std::is_same_v<T, at::Tensor>;

/// A cross attention's memory in the forward's tensor type (none: undefined / nullopt).
template <typename T>
using Memory = std::conditional_t<kPlain<T>, at::Tensor, std::optional<DTensor>>;
inline bool has(const at::Tensor& memory) { return memory.defined(); }
inline bool has(const std::optional<DTensor>& memory) { return memory.has_value(); }
inline const at::Tensor& get(const at::Tensor& memory) { return memory; }
inline const DTensor& get(const std::optional<DTensor>& memory) { return *memory; }

/// The parameter `local` (this process's piece of `name`) as the tensor type of `like`.
inline const at::Tensor& param(const ShardedModule&, const char*, const at::Tensor& local,
                               const at::Tensor&) {
  return local;
}
inline DTensor param(const ShardedModule& module, const char* name, const at::Tensor& local,
                     const DTensor& like) {
  return module.as_dtensor(name, local, like.mesh());
}
/// An optional parameter (undefined when the module has none): an at::Tensor that may be
/// undefined, or a std::optional<DTensor>.
inline const at::Tensor& param_or_none(const ShardedModule&, const char*, const at::Tensor& local,
                                       const at::Tensor&) {
  return local;
}
inline std::optional<DTensor> param_or_none(const ShardedModule& module, const char* name,
                                            const at::Tensor& local, const DTensor& like) {
  if (!local.defined()) return std::nullopt;
  return module.as_dtensor(name, local, like.mesh());
}

/// A module's forward on a plain tensor needs its whole parameters (it was not built under a
/// mesh); a DTensor forward takes any.
inline void enter(const ShardedModule& module, const char* what, const at::Tensor&) {
  require_unsharded(module, what);
}
inline void enter(const ShardedModule&, const char*, const DTensor&) {}

/// Packed sequences (qkv_format "thd") as a batch of one and back: [tokens, ...] <->
/// [1, tokens, ...]. On a DTensor the shards follow their dims; a split token dim is a te::Error
/// (as TE's thd has no such layout) unless `context_parallel` (the tokens split over the cp
/// mesh axes in TE's thd layout, te/nn/context_parallel.h); a split batch of one always is.
inline at::Tensor batch_of_one(const at::Tensor& t, bool = false) { return t.unsqueeze(0); }
DTensor batch_of_one(const DTensor& t, bool context_parallel = false);
inline at::Tensor tokens_only(const at::Tensor& t, bool = false) { return t.squeeze(0); }
DTensor tokens_only(const DTensor& t, bool context_parallel = false);

/// Rows of packed sequences (qkv_format "thd", [rows, tokens, ...] with 2-D cu_seqlens; or
/// bshd rows whose tokens are in the load-balanced cp order): fn on this rank's rows, the index
/// of its first, and the context parallel size and rank of its tokens; the result in x's layout
/// (its last dim fn's). A DTensor's rows may be split over mesh
/// axes (data parallel), its last dim not, its tokens over the cp mesh axes when
/// `context_parallel` (each rank holding its chunks of every sequence, TE's thd layout; two
/// axes, a2a+p2p's, make one cp rank, major to minor).
using RowsFn = std::function<at::Tensor(const at::Tensor& rows, int64_t row_offset, int64_t cp_size,
                                        int64_t cp_rank)>;
inline at::Tensor on_packed_rows(const at::Tensor& x, const RowsFn& fn, bool = false) {
  return fn(x, 0, 1, 0);
}
DTensor on_packed_rows(const DTensor& x, const RowsFn& fn, bool context_parallel = false);

inline std::string shape_of(const at::Tensor& x) {
  if (!x.defined()) return "undefined";
  std::ostringstream os;
  os << x.sizes();
  return os.str();
}
inline std::string shape_of(const DTensor& x) { return x.to_string(); }
/// "Float [4, 8]" (or "undefined"): an operand in an error that names its dtype too.
inline std::string dtype_and_shape(const at::Tensor& x) {
  if (!x.defined()) return "undefined";
  std::ostringstream os;
  os << x.scalar_type() << " " << x.sizes();
  return os.str();
}

/// x @ kernel (+ bias), with x constrained to `input_axes` and the product to `output_axes`
/// (either may be empty: no constraint). The module's parameters are `<prefix>kernel` and
/// `<prefix>bias` (bias undefined: none) and `fp8` the GEMM's FP8 state.
/// A kernel held in GGUF blocks (ShardedModule::hold_blocks) multiplies from its blocks.
inline at::Tensor project(const ShardedModule& module, const at::Tensor& x, const char* prefix,
                          const at::Tensor& kernel, const at::Tensor& bias,
                          const std::shared_ptr<fp8::GemmMeta>& fp8, const LogicalAxes& input_axes,
                          const LogicalAxes& output_axes) {
  const std::string name = std::string(prefix) + "kernel";
  if (const ShardedModule::HeldBlocks* held = module.held_blocks(name)) {
    const at::Tensor in = constrain(x, input_axes);
    std::vector<int64_t> shape(in.sizes().begin(), in.sizes().end() - 1);
    shape.insert(shape.end(), held->shape.begin() + 1, held->shape.end());
    const at::Tensor y = block_linear(in, *held->matrix, "the kernel '" + name + "'").view(shape);
    return constrain(bias.defined() ? y + bias : y, output_axes);
  }
  return constrain(functional::dense(constrain(x, input_axes), kernel, fp8, nullptr, bias),
                   output_axes);
}
inline DTensor project(const ShardedModule& module, const DTensor& x, const char* prefix,
                       const at::Tensor& kernel, const at::Tensor& bias,
                       const std::shared_ptr<fp8::GemmMeta>& fp8, const LogicalAxes& input_axes,
                       const LogicalAxes& output_axes) {
  const std::string name(prefix);
  DTensor y =
      functional::dense(x, module.as_dtensor(name + "kernel", kernel, x.mesh()), input_axes, fp8);
  y = constrain(y, output_axes);
  if (bias.defined()) {
    y = functional::add_bias(y, module.as_dtensor(name + "bias", bias, x.mesh()));
  }
  return y;
}

}  // namespace te::nn::detail
