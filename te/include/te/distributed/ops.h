#pragma once

// Operations on DTensors, beside DTensor: the layout helpers sharded ops share (make some mesh
// dims whole, count the pieces of a dim) and the view and element-wise ops whose layout follows
// from the placements. te::nn::functional offers the ops beside their at::Tensor forms.

#include <ATen/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "te/distributed/dtensor.h"

namespace te {

/// x with every mesh dim m where `replicate(placement, m)` holds made Replicate (a shard
/// gathered, a partial sum reduced), redistributed only when something changes: how an op that
/// needs a dim whole, or real values, takes its input.
DTensor replicated_where(const DTensor& x,
                         const std::function<bool(const Placement&, std::size_t)>& replicate);
/// x with its partial sums reduced (every Partial mesh dim made Replicate).
DTensor reduced(const DTensor& x);

/// How many pieces tensor dim `dim` is cut into: the product of the sizes of the mesh dims that
/// shard it.
int64_t shard_parts(const DeviceMesh& mesh, const std::vector<Placement>& placements, int64_t dim);
inline int64_t shard_parts(const DTensor& x, int64_t dim) {
  return shard_parts(x.mesh(), x.placements(), dim);
}

namespace ops {

/// x.select(dim, index); a dim sharded there is gathered first.
DTensor select(const DTensor& x, int64_t dim, int64_t index);
/// Splits dim `dim` into (outer, inner); a shard of `dim` becomes a shard of `outer` when it
/// divides it evenly (else the dim is gathered first).
DTensor unflatten(const DTensor& x, int64_t dim, int64_t outer, int64_t inner);
/// Merges dims `dim` and `dim + 1`; a shard of `dim` stays a shard of the merged dim when even.
DTensor flatten(const DTensor& x, int64_t dim);
/// a + b, b moved to a's layout first.
DTensor add(const DTensor& a, const DTensor& b);
/// `whole` (the same on every rank) distributed with `like`'s mesh and placements.
DTensor laid_out_like(const DTensor& like, const at::Tensor& whole);
/// Applies an element-wise `fn` to x's local piece (a Partial x is reduced first: f(sum) is not
/// the sum of f).
DTensor elementwise(const DTensor& x, const std::function<at::Tensor(const at::Tensor&)>& fn);

}  // namespace ops
}  // namespace te
