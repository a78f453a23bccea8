// DotProductAttention's operands on a mesh (attention_operands.h).

#include "attention_operands.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

#include "te/distributed/ops.h"
#include "te/error.h"
#include "te/sharding.h"

namespace te::nn::detail {

Arranged<at::Tensor> arrange(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             std::optional<CpCommType>) {
  return {q, k, v};
}

namespace {

// The mesh dims that split q's sequence (dim 1) under context parallelism, major to minor (one,
// or a2a+p2p's two: the ring's, the a2a's).
std::vector<int64_t> context_parallel_dims(const DTensor& query, CpCommType type) {
  std::vector<int64_t> dims;
  for (int64_t m = 0; m < query.mesh().ndim(); ++m) {
    if (is_shard(query.placements()[static_cast<std::size_t>(m)], 1)) dims.push_back(m);
  }
  // (how many axes a cp_comm_type takes is functional::ContextParallel's to say)
  TE_CHECK(!dims.empty(), "DotProductAttention: cp_comm_type '", te_name(type), "' is set, but q ",
           query.to_string(),
           "'s sequence is split over no mesh axis; map the logical axis 'seqlen_cp' to a mesh "
           "axis in the rules (or MeshResource cp), or unset cp_comm_type");
  return dims;
}

}  // namespace

Arranged<DTensor> arrange(const DTensor& query, const DTensor& key, const DTensor& value,
                          std::optional<CpCommType> context_parallel) {
  const std::vector<int64_t> cp_dims =
      context_parallel ? context_parallel_dims(query, *context_parallel) : std::vector<int64_t>{};
  auto whole = [&cp_dims](const DTensor& t) {
    return replicated_where(t, [&cp_dims](const Placement& p, std::size_t m) {
      const bool cp =
          std::find(cp_dims.begin(), cp_dims.end(), static_cast<int64_t>(m)) != cp_dims.end();
      return is_partial(p) || (is_shard(p, 1) && !cp) || is_shard(p, 3);
    });
  };
  const DTensor q = whole(query);
  // Heads split over mesh axes must split whole query and key/value heads (GQA groups), the
  // same on every rank; checked before any collective so every rank stops here alike.
  const int64_t head_ranks = shard_parts(q, 2);
  std::string head_axes;
  for (int64_t m = 0; m < q.mesh().ndim(); ++m) {
    if (is_shard(q.placements()[static_cast<std::size_t>(m)], 2)) {
      head_axes += (head_axes.empty() ? "'" : ", '") +
                   q.mesh().axis_names()[static_cast<std::size_t>(m)] + "'";
    }
  }
  TE_CHECK(q.size(2) % head_ranks == 0 && key.size(2) % head_ranks == 0,
           "DotProductAttention: ", q.size(2), " query heads and ", key.size(2),
           " key/value heads (num_gqa_groups) cannot be split evenly over the ", head_ranks,
           " ranks of mesh axes ", head_axes,
           " that shard the heads; use head counts that are "
           "multiples of ",
           head_ranks, " or shard the heads over fewer ranks");
  const auto piece = local_chunks(q.sizes(), q.mesh(), q.placements(), q.mesh().rank());
  return {q,
          whole(key).redistribute(q.placements()),
          whole(value).redistribute(q.placements()),
          piece[0].offset,
          piece[2].offset,
          cp_dims};
}

at::Tensor swapped(const at::Tensor& t) { return t.transpose(0, 1); }
DTensor swapped(const DTensor& t) {
  std::vector<Placement> p = t.placements();
  for (Placement& x : p) {
    if (is_shard(x, 0)) {
      x = Shard{1};
    } else if (is_shard(x, 1)) {
      x = Shard{0};
    }
  }
  std::vector<int64_t> shape = t.sizes();
  std::swap(shape[0], shape[1]);
  return DTensor::from_local(t.to_local().transpose(0, 1), t.mesh(), p, shape);
}
const at::Tensor& local(const at::Tensor& t) { return t; }
at::Tensor local(const DTensor& t) { return t.to_local(); }

at::Tensor in_layout_of(const at::Tensor& out, const at::Tensor&) { return out; }
DTensor in_layout_of(const at::Tensor& out, const DTensor& q) {
  std::vector<int64_t> shape = q.sizes();
  shape.back() = out.size(-1);  // v's head dim (head_dim_v)
  return DTensor::from_local(out, q.mesh(), q.placements(), shape);
}

at::Tensor logits_operand(const at::Tensor& t, const at::Tensor&, int64_t, int64_t) { return t; }
at::Tensor logits_operand(const DTensor& t, const DTensor& q, int64_t batch_dim, int64_t head_dim) {
  std::vector<Placement> target, grads;
  for (const Placement& p : q.placements()) {
    const int64_t dim = is_shard(p, 0) ? batch_dim : is_shard(p, 2) ? head_dim : -2;
    if (dim == -2) {
      target.push_back(Replicate{});
      grads.push_back(Replicate{});
    } else if (dim >= 0 && t.size(dim) > 1) {
      target.push_back(Shard{dim});
      grads.push_back(Shard{dim});
    } else {
      target.push_back(Replicate{});
      grads.push_back(Partial{});
    }
  }
  return t.redistribute(target, grads).to_local();
}
at::Tensor logits_operand(const at::Tensor& t, const DTensor& q, int64_t batch_dim,
                          int64_t head_dim) {
  if (!t.defined()) return t;
  const std::vector<Placement> whole(static_cast<std::size_t>(q.mesh().ndim()), Replicate{});
  return logits_operand(DTensor::from_local(t, q.mesh(), whole, t.sizes().vec()), q, batch_dim,
                        head_dim);
}

std::function<at::Tensor(const at::Tensor&)> logits_constraint(const at::Tensor&,
                                                               const at::Tensor&) {
  return [](const at::Tensor& logits) {
    return with_sharding_constraint(logits,
                                    {axis::kBatch, axis::kHeads, std::nullopt, std::nullopt});
  };
}
std::function<at::Tensor(const at::Tensor&)> logits_constraint(const DTensor& q, const DTensor& k) {
  std::vector<Placement> weights = q.placements();
  for (Placement& p : weights) {
    if (is_shard(p, 2)) p = Shard{1};
  }
  const std::vector<int64_t> shape = {q.size(0), q.size(2), q.size(1), k.size(1)};
  const DeviceMesh mesh = q.mesh();
  return [weights, shape, mesh](const at::Tensor& logits) {
    return with_sharding_constraint(DTensor::from_local(logits, mesh, weights, shape),
                                    {axis::kBatch, axis::kHeads, std::nullopt, std::nullopt})
        .redistribute(weights)
        .to_local();
  };
}

}  // namespace te::nn::detail
