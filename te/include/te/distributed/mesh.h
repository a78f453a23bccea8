#pragma once

// A named, row-major grid of the world's ranks, with one process group per row of each axis.

#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "te/distributed/placement.h"
#include "te/distributed/world.h"
#include "te/sharding/context.h"

namespace te {

namespace detail {
struct MeshState;
class World;
}  // namespace detail

/// DeviceMesh({2, 2}, {"data", "model"}): rank r sits at coordinates (r / 2, r % 2). Created
/// collectively: every rank of the world constructs the same meshes in the same order. The
/// product of the shape must equal the world size (1 when not distributed). `algorithms`
/// overrides the world's choice of primitives for this mesh.
class DeviceMesh {
 public:
  DeviceMesh(std::vector<int64_t> shape, std::vector<std::string> axis_names,
             std::optional<CollectiveAlgorithms> algorithms = std::nullopt);

  int64_t ndim() const;
  /// The number of ranks in the mesh.
  int64_t size() const;
  int64_t size(const std::string& axis) const;
  int64_t size(int64_t dim) const;
  const std::vector<int64_t>& shape() const;
  const std::vector<std::string>& axis_names() const;
  /// The mesh dim of `axis`; throws te::Error listing the mesh's axes when it has none such.
  int64_t axis_index(const std::string& axis) const;
  bool has_axis(const std::string& axis) const;

  /// This rank's world rank and its index along each axis.
  int64_t rank() const;
  int64_t coordinate(const std::string& axis) const;
  int64_t coordinate(int64_t dim) const;
  std::vector<int64_t> coordinates_of(int64_t rank) const;
  /// The world ranks of this rank's row along mesh dim `dim`, in coordinate order.
  std::vector<int64_t> group_ranks(int64_t dim) const;

  /// Reduces `t` (whole on every rank) over the sub-grid of mesh dims `dims` through this rank
  /// and returns the result (a new tensor). Collective: every rank of the mesh calls it with the
  /// same dims, in the same order.
  at::Tensor all_reduce(const at::Tensor& t, ReduceOp op, const std::vector<int64_t>& dims) const;
  /// One step of a ring along mesh dim `dim` (context parallelism's K/V pass): `t` goes to the
  /// rank `shift` places on along that dim (wrapping), and what the rank `shift` places back
  /// sent is returned (a new tensor of t's shape and dtype, which every rank of the row gives
  /// alike), or written into `out` (contiguous, t's shape and dtype: a buffer the caller
  /// allocated, e.g. on the thread whose memory it accounts). Collective over the row: every
  /// rank of it calls it with the same shift. Not differentiable (a ring's backward passes
  /// gradients round itself).
  at::Tensor ring_shift(const at::Tensor& t, int64_t dim, int64_t shift,
                        at::Tensor out = {}) const;
  /// A ragged all-to-all of rows along mesh dim `dim` (expert parallelism's token exchange):
  /// `rows` [N, ...] holds send_rows[s] rows for row rank s, back to back in rank order, and
  /// the result holds recv_rows[s] rows from row rank s, in rank order (the trailing dims and
  /// dtype of `rows`). Every rank's send_rows[r] must be rank r's recv_rows of it: exchange the
  /// counts first (an all_to_all_rows of the counts, one row each). Collective over the row;
  /// not differentiable (its gradient is the same exchange with the counts swapped).
  at::Tensor all_to_all_rows(const at::Tensor& rows, int64_t dim,
                             const std::vector<int64_t>& send_rows,
                             const std::vector<int64_t>& recv_rows) const;
  /// Every rank's `mine` (bytes, any length), in rank order over the whole mesh (one process:
  /// just `mine`). Collective: every rank of the mesh calls it.
  std::vector<std::string> all_gather(const std::string& mine) const;
  /// The same over the sub-grid of mesh dims `dims` through this rank, in coordinate order
  /// (row-major over `dims`). Collective over that sub-grid, with the same dims on every rank.
  std::vector<std::string> all_gather(const std::string& mine,
                                      const std::vector<int64_t>& dims) const;
  /// World rank `root`'s `bytes` on every rank of the mesh (the others' `bytes` are ignored):
  /// the length, then the bytes, each one collective over the whole mesh. Collective: every rank
  /// of the mesh calls it with the same root.
  std::string broadcast(const std::string& bytes, int64_t root = 0) const;
  /// Returns once every rank of the mesh has called it.
  void barrier() const;

  /// "DeviceMesh(data=2, model=2)".
  std::string to_string() const;

  /// Meshes are equal when they are the same collective object (copies share it).
  friend bool operator==(const DeviceMesh& a, const DeviceMesh& b) { return a.state_ == b.state_; }
  friend bool operator!=(const DeviceMesh& a, const DeviceMesh& b) { return !(a == b); }

  /// Internal state (process groups), shared by copies and kept alive by autograd graphs.
  const detail::MeshState& state() const { return *state_; }
  const std::shared_ptr<const detail::MeshState>& shared_state() const { return state_; }

 private:
  std::shared_ptr<const detail::MeshState> state_;
};

/// Makes `mesh` the current mesh of this thread until the guard is destroyed (nests); its axis
/// sizes are what TE's table reads meanwhile (a MeshShapeScope).
class MeshScope {
 public:
  explicit MeshScope(const DeviceMesh& mesh);
  ~MeshScope();
  MeshScope(const MeshScope&) = delete;
  MeshScope& operator=(const MeshScope&) = delete;

 private:
  DeviceMesh mesh_;
  MeshShapeScope shape_;
};

/// The innermost MeshScope's mesh on this thread, or nullptr.
const DeviceMesh* current_mesh();

/// Everything a thread's constraints depend on: the sharding context (rules, MeshResource), the
/// current mesh and the world this thread is a rank of.
struct DistributedContext {
  ShardingContext sharding;
  std::optional<DeviceMesh> mesh;
  std::shared_ptr<detail::World> world;  ///< the rank membership of the capturing thread
};

/// Captures this thread's context, to be re-opened on a worker thread (thread pools, servers).
DistributedContext capture_distributed_context();

/// Re-opens a captured context on this thread for the guard's lifetime.
///
/// Example:
///   auto ctx = te::capture_distributed_context();
///   pool.submit([ctx] { te::DistributedContextScope scope(ctx); layer->forward(x); });
class DistributedContextScope {
 public:
  explicit DistributedContextScope(const DistributedContext& context);
  ~DistributedContextScope();
  DistributedContextScope(const DistributedContextScope&) = delete;
  DistributedContextScope& operator=(const DistributedContextScope&) = delete;

 private:
  ShardingContextScope sharding_;
  std::optional<MeshScope> mesh_;
};

}  // namespace te
