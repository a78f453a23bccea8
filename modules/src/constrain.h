#pragma once

// Small helpers the module implementations share (internal).

#include <ATen/Tensor.h>

#include <string>

#include "te/distributed/dtensor.h"
#include "te/error.h"
#include "te/nn/sharded.h"

namespace te::nn {

/// `axes` unchanged, or `n` unnamed dims when it is empty (a parameter with no axes given).
inline LogicalAxes axes_or_unnamed(const LogicalAxes& axes, int64_t n) {
  return axes.empty() ? LogicalAxes(static_cast<std::size_t>(n), std::nullopt) : axes;
}

/// with_sharding_constraint when axes are given; the tensor itself otherwise.
inline DTensor constrain(const DTensor& x, const LogicalAxes& axes) {
  return axes.empty() ? x : with_sharding_constraint(x, axes);
}
inline at::Tensor constrain(const at::Tensor& x, const LogicalAxes& axes) {
  return axes.empty() ? x : with_sharding_constraint(x, axes);
}

/// A module holding only its shards cannot take a plain tensor.
inline void require_unsharded(const ShardedModule& module, const char* what) {
  TE_CHECK(!module.is_sharded(), what,
           ": this module holds only its shard of some parameters (it was built under a mesh); "
           "pass the input as a te::DTensor on that mesh");
}

}  // namespace te::nn
