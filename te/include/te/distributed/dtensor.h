#pragma once

// A tensor laid out over a DeviceMesh: this rank's local piece plus the placements that say how
// the pieces form the global tensor. Eager: redistribute runs the collectives, with autograd.

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "te/distributed/mesh.h"
#include "te/distributed/placement.h"
#include "te/sharding/axis_rules.h"
#include "te/sharding/context.h"

namespace te {

class DTensor {
 public:
  DTensor() = default;

  /// Splits `global` (the same on every rank) per `placements` and keeps this rank's piece.
  /// Partial placements are an error (Partial arises from computation; see from_local).
  static DTensor distribute(const at::Tensor& global, const DeviceMesh& mesh,
                            std::vector<Placement> placements);

  /// Wraps this rank's piece. Without `global_shape`, every sharded dim is assumed even (local
  /// size x mesh size); with it, each rank's piece must have its torch.chunk size, or te::Error
  /// names the dim and the rank. Differentiable: gradients reach `local`.
  static DTensor from_local(const at::Tensor& local, const DeviceMesh& mesh,
                            std::vector<Placement> placements,
                            std::optional<std::vector<int64_t>> global_shape = std::nullopt);

  /// This rank's piece (shares autograd history with the DTensor).
  const at::Tensor& to_local() const { return local_; }

  /// This rank's piece, for computing on locally with gradients that arrive in
  /// `grad_placements` (e.g. {Partial()} when each rank's gradient is a partial sum, as for the
  /// replicated input of a column-parallel matmul): backward redistributes them to this tensor's
  /// own layout (there: one all-reduce). When this tensor came straight from redistribute, the
  /// gradients go to that redistribute's source in one transition, as redistribute(placements,
  /// grad_placements) would send them: x.redistribute({Replicate}).to_local({Partial}) from
  /// Shard(0) reduce-scatters its gradient instead of all-reducing and slicing it.
  at::Tensor to_local(const std::vector<Placement>& grad_placements) const;

  /// The whole tensor on every rank (redistribute to all-Replicate). Differentiable.
  at::Tensor full_tensor() const;

  /// Moves data to `placements` with the collectives of each per-mesh-dim transition; backward
  /// runs the reverse transitions. Redistributing to Partial is an error.
  DTensor redistribute(std::vector<Placement> placements) const;

  /// Like redistribute, but the gradients that reach the result are declared to be in
  /// `grad_placements` and go straight to this tensor's own layout in one transition. An FSDP
  /// weight gathered with {Replicate()} for a matmul over a batch-sharded input gets
  /// grad_placements {Partial()}: its gradient is then reduce-scattered, not all-reduced.
  DTensor redistribute(std::vector<Placement> placements,
                       std::vector<Placement> grad_placements) const;

  const std::vector<int64_t>& sizes() const { return global_shape_; }
  int64_t size(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(global_shape_.size()); }
  const std::vector<Placement>& placements() const { return placements_; }
  const DeviceMesh& mesh() const;
  bool defined() const { return local_.defined(); }

  /// "DTensor(sizes=[4, 8], mesh=DeviceMesh(data=2), placements=[Shard(0)])".
  std::string to_string() const;

 private:
  DTensor(at::Tensor local, DeviceMesh mesh, std::vector<Placement> placements,
          std::vector<int64_t> global_shape);

  at::Tensor local_;
  std::optional<DeviceMesh> mesh_;
  std::vector<Placement> placements_;
  std::vector<int64_t> global_shape_;
  /// Set by redistribute (when gradients are recorded): the tensor it started from, so
  /// to_local(grad_placements) can send gradients straight back to it in one transition.
  struct Origin;
  std::shared_ptr<const Origin> origin_;
};

/// This rank's piece of a dim-`global_shape` tensor under `placements` on `mesh`, as
/// (offset, length) per tensor dim (Partial and Replicate dims are whole).
std::vector<Chunk> local_chunks(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh,
                                const std::vector<Placement>& placements, int64_t rank);

/// Options of a sharding constraint beyond the fallback.
struct ConstraintOptions {
  RulesFallback fallback = RulesFallback::kAxisIsUnsharded;
  /// Require every sharded dim to divide evenly over its mesh axes (te::Error otherwise).
  bool require_even = false;
};

/// The placements that `spec` asks for on `mesh`: a dim sharded over mesh axes (a, b) is
/// Shard(dim) on each of them, listed major to minor as the mesh orders them; other mesh dims are
/// Replicate. Throws te::Error naming an unknown mesh axis (listing the mesh's axes) or a tuple
/// out of mesh order.
std::vector<Placement> placements_for(const PartitionSpec& spec, const DeviceMesh& mesh);

/// The placements logical `axes` ask for on `mesh`: resolved with the rules in effect
/// (resolve_logical_axes) and mapped onto the mesh (placements_for). nullopt when there is no
/// constraint (no rules and no MeshResource in scope, or `fallback` dropped it). Every module
/// and constraint resolves through this.
std::optional<std::vector<Placement>> resolve_placements(
    const LogicalAxes& axes, const DeviceMesh& mesh,
    RulesFallback fallback = RulesFallback::kAxisIsUnsharded);

/// Resolves `axes` in the current sharding context (rules, or TE's table under a MeshResource)
/// and redistributes `x` to that layout on the current mesh; Partial inputs are reduced
/// (reduce-scattered where the spec shards a dim). No mesh in scope, or no constraint, returns
/// `x` unchanged. Throws te::Error when the number of axes differs from x.dim(), for an unknown
/// mesh axis, or when x lives on another mesh than the current one.
DTensor with_sharding_constraint(const DTensor& x, const LogicalAxes& axes,
                                 RulesFallback fallback = RulesFallback::kAxisIsUnsharded);
DTensor with_sharding_constraint(const DTensor& x, const LogicalAxes& axes,
                                 const ConstraintOptions& options);

/// The plain-tensor form: validates `axes` against x (rank, repeated names, rules) and returns x.
/// A plain tensor has no layout, so under a current mesh of more than one rank it is an error:
/// wrap it with DTensor::distribute or DTensor::from_local first.
at::Tensor with_sharding_constraint(const at::Tensor& x, const LogicalAxes& axes,
                                    RulesFallback fallback = RulesFallback::kAxisIsUnsharded);

/// Which rank holds which block of `x`, one line per rank, e.g.
///   rank 1 (data=0, model=1): [0:3, 2:4]
std::string visualize_sharding(const DTensor& x);

}  // namespace te
