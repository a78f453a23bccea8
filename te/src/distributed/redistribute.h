#pragma once

// Moving a DTensor's data from one layout to another (internal): the planner, the table of moves
// and the one autograd function that runs a plan (docs/ARCHITECTURE.md §3). Everything a
// placement-level move is lives in redistribute.cpp.

#include <ATen/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "te/distributed/dtensor.h"

namespace te::detail {

/// One relayout of this rank's local tensor.
struct RelayoutSpec {
  std::vector<int64_t> global_shape;
  std::optional<DeviceMesh> mesh;
  std::vector<Placement> src, dst;
  /// The layout the gradient arrives in, when declared (DTensor::to_local(grad_placements),
  /// redistribute(placements, grad_placements)): backward then takes it to the source's gradient
  /// layout in one planned move. Otherwise backward runs each move's reverse.
  std::optional<std::vector<Placement>> grad_in;
  /// The result when the data already moved (to_local re-planning a redistribute's backward):
  /// forward returns it instead of moving the input again.
  at::Tensor done;
};

/// Runs `spec` on `local` as one autograd node (see RelayoutSpec for its backward). A parameter
/// (a leaf that requires grad) whose declared gradient only needs sums over some mesh rows may
/// have them taken over by the thread's GradientReductionHook.
at::Tensor relayout(const at::Tensor& local, RelayoutSpec spec);

/// Moves data from `src` to `dst` without recording anything for autograd.
at::Tensor move_data(const at::Tensor& local, const std::vector<int64_t>& global_shape,
                     const DeviceMesh& mesh, const std::vector<Placement>& src,
                     const std::vector<Placement>& dst);

/// Throws te::Error when `dst` cannot be reached from `src` (a target Partial that differs from
/// the source).
void check_reachable(const std::vector<Placement>& src, const std::vector<Placement>& dst);

/// The layout gradients take: that of the tensor, with Partial replaced by Replicate.
std::vector<Placement> gradient_layout(std::vector<Placement> placements);

}  // namespace te::detail
