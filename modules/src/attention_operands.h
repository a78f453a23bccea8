#pragma once

// DotProductAttention's operands on a mesh (attention.cpp, attention_operands.cpp): where this
// rank's piece of q, k and v sits, and the tensors the logits read narrowed to it. Each has an
// at::Tensor form (one device: everything) and a DTensor one. Internal to te::nn.

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "te/distributed/dtensor.h"
#include "te/nn/attention_types.h"

namespace te::nn::detail {

/// Where attention runs: q, k, v in the layout attention computes in, and this process's piece
/// of the global [batch, seqlen, heads, head_dim] (its batch rows and heads).
template <typename T>
struct Arranged {
  T q, k, v;
  int64_t batch_offset = 0, head_offset = 0;
  /// Context parallelism: the mesh dims the sequence stays split over, major to minor (none:
  /// whole sequences).
  std::vector<int64_t> cp_dims;
};
/// On a mesh attention is local to each (batch, head): whole sequences and head dims, batch and
/// heads sharded alike on q, k and v (a te::Error when the heads split unevenly). With
/// `context_parallel` the sequence stays split over the mesh axes that split q's: one, or two
/// for a2a+p2p (a te::Error naming another count).
Arranged<at::Tensor> arrange(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             std::optional<CpCommType> context_parallel = std::nullopt);
Arranged<DTensor> arrange(const DTensor& query, const DTensor& key, const DTensor& value,
                          std::optional<CpCommType> context_parallel = std::nullopt);

/// q, k, v in sbhd as bshd and back (dims 0 and 1 swapped); on a DTensor the shards follow.
at::Tensor swapped(const at::Tensor& t);
DTensor swapped(const DTensor& t);
const at::Tensor& local(const at::Tensor& t);
at::Tensor local(const DTensor& t);

/// The attention output in q's layout.
at::Tensor in_layout_of(const at::Tensor& out, const at::Tensor& q);
DTensor in_layout_of(const at::Tensor& out, const DTensor& q);

/// A tensor the logits [batch, heads, seqlen_q, seqlen_kv] read (a mask, a bias, ALiBi's slopes,
/// the sink logits) as this rank's operand: `batch_dim` and `head_dim` are its dims that
/// broadcast against the logits' batch and heads (-1: none). On one device it is the tensor
/// itself. On a mesh, given whole (the same on every rank) or as a parameter's DTensor: where q
/// splits its batch (dim 0) or heads (dim 2) over a mesh axis, a full-size batch or head dim is
/// split alike (its gradient gathered back), and a dim of one or an absent one stays whole, its
/// gradient a partial sum over that axis (reduced): every rank gets the whole gradient one
/// process computes.
at::Tensor logits_operand(const at::Tensor& t, const at::Tensor& q, int64_t batch_dim,
                          int64_t head_dim);
at::Tensor logits_operand(const DTensor& t, const DTensor& q, int64_t batch_dim, int64_t head_dim);
at::Tensor logits_operand(const at::Tensor& t, const DTensor& q, int64_t batch_dim,
                          int64_t head_dim);

/// The unfused path's constraint on the attention weights [batch, heads, sq, sk], which carry
/// q's batch and head shards. On one device it validates the constraint; the two sequence dims
/// stay unnamed, since one logical name may not shard two dims of a tensor.
std::function<at::Tensor(const at::Tensor&)> logits_constraint(const at::Tensor& q,
                                                               const at::Tensor& k);
std::function<at::Tensor(const at::Tensor&)> logits_constraint(const DTensor& q, const DTensor& k);

}  // namespace te::nn::detail
