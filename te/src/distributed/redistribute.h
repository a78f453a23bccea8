#pragma once

// The redistribute planner and executor (internal).

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

#include "te/distributed/dtensor.h"

namespace te::detail {

/// One per-mesh-dim transition.
struct Step {
  enum class Kind {
    kGather,         ///< Shard(dim) -> Replicate: all-gather
    kSlice,          ///< Replicate -> Shard(dim): keep this rank's chunk, no communication
    kAllToAll,       ///< Shard(dim) -> Shard(dim2): all-to-all
    kReduce,         ///< Partial(op) -> Replicate: all-reduce
    kReduceScatter,  ///< Partial(op) -> Shard(dim): reduce-scatter (sum / avg)
  };
  Kind kind;
  int64_t mesh_dim;
  int64_t dim;
  int64_t dim2;
  ReduceOp op;
};

/// The transitions, in order, that take `src` placements to `dst` (same mesh). Throws te::Error
/// for a target Partial that differs from the source.
std::vector<Step> plan_redistribute(const std::vector<Placement>& src,
                                    const std::vector<Placement>& dst);

/// Runs the plan on this rank's local tensor, differentiably.
at::Tensor run_redistribute(const at::Tensor& local, const std::vector<int64_t>& global_shape,
                            const DeviceMesh& mesh, const std::vector<Placement>& src,
                            const std::vector<Placement>& dst);

}  // namespace te::detail
