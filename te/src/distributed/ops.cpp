// DTensor operations beside DTensor (te/distributed/ops.h).

#include "te/distributed/ops.h"

#include <ATen/ATen.h>

#include "te/error.h"

namespace te {

DTensor replicated_where(const DTensor& x,
                         const std::function<bool(const Placement&, std::size_t)>& replicate) {
  std::vector<Placement> target = x.placements();
  bool change = false;
  for (std::size_t m = 0; m < target.size(); ++m) {
    if (!is_replicate(target[m]) && replicate(target[m], m)) {
      target[m] = Replicate{};
      change = true;
    }
  }
  return change ? x.redistribute(target) : x;
}

DTensor reduced(const DTensor& x) {
  return replicated_where(x, [](const Placement& p, std::size_t) { return is_partial(p); });
}

int64_t shard_parts(const DeviceMesh& mesh, const std::vector<Placement>& placements, int64_t dim) {
  int64_t parts = 1;
  for (std::size_t m = 0; m < placements.size(); ++m) {
    if (is_shard(placements[m], dim)) parts *= mesh.size(static_cast<int64_t>(m));
  }
  return parts;
}

namespace ops {

namespace {

// x with every mesh dim sharding tensor dim `dim` gathered.
DTensor whole_dim(const DTensor& x, int64_t dim) {
  return replicated_where(x, [dim](const Placement& p, std::size_t) { return is_shard(p, dim); });
}

// The placements with every Shard dim above `dim` moved by `by`.
std::vector<Placement> shifted_above(std::vector<Placement> placements, int64_t dim, int64_t by) {
  for (Placement& p : placements) {
    if (auto* s = std::get_if<Shard>(&p); s != nullptr && s->dim > dim) s->dim += by;
  }
  return placements;
}

}  // namespace

DTensor select(const DTensor& x_in, int64_t dim, int64_t index) {
  const DTensor x = whole_dim(x_in, dim);
  std::vector<int64_t> shape = x.sizes();
  shape.erase(shape.begin() + dim);
  return DTensor::from_local(x.to_local().select(dim, index), x.mesh(),
                             shifted_above(x.placements(), dim, -1), shape);
}

DTensor unflatten(const DTensor& x_in, int64_t dim, int64_t outer, int64_t inner) {
  TE_CHECK(x_in.size(dim) == outer * inner, "unflatten: dim ", dim, " of ", x_in.to_string(),
           " is not ", outer, " x ", inner);
  const DTensor x = outer % shard_parts(x_in, dim) == 0 ? x_in : whole_dim(x_in, dim);
  std::vector<int64_t> shape = x.sizes();
  shape[static_cast<std::size_t>(dim)] = outer;
  shape.insert(shape.begin() + dim + 1, inner);
  std::vector<int64_t> local_shape(x.to_local().sizes().begin(), x.to_local().sizes().end());
  local_shape[static_cast<std::size_t>(dim)] = x.to_local().size(dim) / inner;
  local_shape.insert(local_shape.begin() + dim + 1, inner);
  return DTensor::from_local(x.to_local().reshape(local_shape), x.mesh(),
                             shifted_above(x.placements(), dim, 1), shape);
}

DTensor flatten(const DTensor& x_in, int64_t dim) {
  const int64_t parts = shard_parts(x_in, dim);
  const bool even = x_in.size(dim) % parts == 0;
  const DTensor x = replicated_where(x_in, [&](const Placement& p, std::size_t) {
    return is_shard(p, dim + 1) || (is_shard(p, dim) && !even);
  });
  std::vector<int64_t> shape = x.sizes();
  shape[static_cast<std::size_t>(dim)] *= shape[static_cast<std::size_t>(dim) + 1];
  shape.erase(shape.begin() + dim + 1);
  return DTensor::from_local(x.to_local().flatten(dim, dim + 1), x.mesh(),
                             shifted_above(x.placements(), dim + 1, -1), shape);
}

DTensor add(const DTensor& a, const DTensor& b) {
  TE_CHECK(a.mesh() == b.mesh(), "add: operands live on different meshes (", a.mesh().to_string(),
           " and ", b.mesh().to_string(), ")");
  TE_CHECK(a.sizes() == b.sizes(), "add: ", a.to_string(), " and ", b.to_string(),
           " differ in shape");
  const DTensor bb = b.placements() == a.placements() ? b : b.redistribute(a.placements());
  return DTensor::from_local(a.to_local() + bb.to_local(), a.mesh(), a.placements(), a.sizes());
}

DTensor laid_out_like(const DTensor& like, const at::Tensor& whole) {
  return DTensor::distribute(whole, like.mesh(), like.placements());
}

DTensor elementwise(const DTensor& x_in, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  const DTensor x = reduced(x_in);
  return DTensor::from_local(fn(x.to_local()), x.mesh(), x.placements(), x.sizes());
}

}  // namespace ops
}  // namespace te
