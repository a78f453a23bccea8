// Context parallel attention (te/nn/context_parallel.h). Each strategy is written in one form: a
// rank's query chunks against blocks of keys at known global positions, where a block's keys are
// visible to a chunk through te's fused kernel's KeyWindow (offset = the chunk's global start
// minus the block's). p2p merges its per-step results by log-sum-exp (TE's
// flash_attn_fwd_softmax_lse_correction and flash_attn_fwd_out_correction, context_parallel.py
// L153-193 at d0067d0da, in float32 as TE-JAX's ring) and, in backward, passes K/V round the ring
// again with their gradients' running sums travelling one hop behind, home after cp hops (TE's
// backward, L2397-2810). all_gather attends each query chunk to the gathered keys in one call
// and reduce-scatters their gradients (L3199-3233, L4052-4123); a2a is two DTensor all-to-alls
// round functional::attention on whole sequences (L387-534).

#include "te/nn/context_parallel.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "attention_piece.h"
#include "context_parallel_blocks.h"
#include "te/distributed/dtensor.h"
#include "te/error.h"
#include "te/nn/functional.h"
#include "te/sharding/context.h"

namespace te::nn::functional {

ContextParallel::ContextParallel(const DeviceMesh& mesh, const std::string& axis,
                                 TeChoice<CpCommType> comm_type, bool load_balanced)
    : ContextParallel(mesh, std::vector<std::string>{axis}, comm_type, load_balanced) {}

ContextParallel::ContextParallel(const DeviceMesh& mesh, const std::vector<std::string>& axes,
                                 TeChoice<CpCommType> comm_type, bool load_balanced)
    : mesh_(mesh), axes_(axes), comm_type_(comm_type), load_balanced_(load_balanced) {
  const std::size_t want = comm_type_ == CpCommType::kA2AP2P ? 2 : 1;
  std::string names;
  for (const std::string& a : axes_) names += (names.empty() ? "'" : ", '") + a + "'";
  TE_CHECK(axes_.size() == want, "context parallelism (cp_comm_type '", te_name(comm_type_),
           "') splits the sequence over ",
           want == 2 ? "two mesh axes, the ring's (p2p) and the "
                       "a2a's, major to minor"
                     : "one mesh axis",
           ", but was given ", axes_.size(), names.empty() ? "" : " (" + names + ")",
           want == 2 ? "; map seqlen_cp to two axes, e.g. rules seqlen_cp=(ring,a2a)"
                     : "; map seqlen_cp to one axis (a2a+p2p takes two)");
  for (const std::string& a : axes_) mesh_dims_.push_back(mesh_.axis_index(a));
  TE_CHECK(mesh_dims_.size() == 1 || mesh_dims_[0] != mesh_dims_[1],
           "context parallelism (cp_comm_type 'a2a+p2p'): the ring and the a2a are both mesh "
           "axis '",
           axes_[0], "'; give two axes");
  TE_CHECK(mesh_dims_.size() == 1 || mesh_dims_[0] < mesh_dims_[1],
           "context parallelism (cp_comm_type 'a2a+p2p'): the ring's mesh axis '", axes_[0],
           "' must come before the a2a's '", axes_[1],
           "' in the mesh (the ring's rank is the major part of the cp rank, as TE's)");
}

std::string ContextParallel::axis() const {
  return axes_.size() == 1 ? axes_[0] : axes_[0] + "+" + axes_[1];
}

int64_t ContextParallel::mesh_dim() const {
  TE_CHECK(mesh_dims_.size() == 1, "context parallelism over mesh axes '", axis(),
           "': internal: one axis' dim asked for");
  return mesh_dims_[0];
}

int64_t ContextParallel::size() const {
  int64_t n = 1;
  for (int64_t d : mesh_dims_) n *= mesh_.size(d);
  return n;
}
int64_t ContextParallel::rank() const {
  int64_t r = 0;
  for (int64_t d : mesh_dims_) r = r * mesh_.size(d) + mesh_.coordinate(d);
  return r;
}

ContextParallel ContextParallel::a2a_part() const {
  TE_CHECK(axes_.size() == 2, "context parallelism over '", axis(), "': internal: not a2a+p2p");
  return ContextParallel(mesh_, axes_[1], CpCommType::kA2A, load_balanced_);
}
ContextParallel ContextParallel::ring_part() const {
  TE_CHECK(axes_.size() == 2, "context parallelism over '", axis(), "': internal: not a2a+p2p");
  return ContextParallel(mesh_, axes_[0], CpCommType::kP2P, load_balanced_);
}

std::vector<CpChunk> cp_chunks(int64_t seqlen, int64_t cp, int64_t rank, bool load_balanced) {
  const int64_t parts = load_balanced ? 2 * cp : cp;
  TE_CHECK(cp >= 1 && rank >= 0 && rank < cp, "cp_chunks: rank ", rank, " is not one of ", cp);
  TE_CHECK(seqlen % parts == 0, "context parallelism over ", cp, " ranks",
           load_balanced ? " (load balanced: 2·cp chunks)" : "", " splits a sequence into ", parts,
           " equal chunks, but it has ", seqlen, " tokens; pad it to a multiple of ", parts);
  const int64_t c = seqlen / parts;
  if (!load_balanced) return {{rank * c, c, 0}};
  return {{rank * c, c, 0}, {(2 * cp - 1 - rank) * c, c, c}};
}

namespace {

// The chunk (of 2cp, or cp) that rank-ordered position p holds.
at::Tensor chunk_ids(int64_t cp, bool load_balanced) {
  if (!load_balanced) return at::arange(cp, at::kLong);
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < cp; ++r) {
    ids.push_back(r);
    ids.push_back(2 * cp - 1 - r);
  }
  return at::tensor(ids, at::kLong);
}

// `t` with dim `dim` cut into `parts` chunks, reordered by `order` (index_select of chunks).
at::Tensor reorder_chunks(const at::Tensor& t, int64_t dim, int64_t parts,
                          const at::Tensor& order) {
  TE_CHECK(t.size(dim) % parts == 0, "context parallelism: dim ", dim, " of ", t.sizes(),
           " does not split into ", parts, " equal chunks");
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  std::vector<int64_t> split = shape;
  split[static_cast<std::size_t>(dim)] = parts;
  split.insert(split.begin() + dim + 1, t.size(dim) / parts);
  return t.reshape(split).index_select(dim, order.to(t.device())).reshape(shape);
}

}  // namespace

at::Tensor cp_shard(const at::Tensor& whole, int64_t dim, int64_t cp, int64_t rank,
                    bool load_balanced) {
  std::vector<at::Tensor> pieces;
  for (const CpChunk& c : cp_chunks(whole.size(dim), cp, rank, load_balanced)) {
    pieces.push_back(whole.narrow(dim, c.start, c.length));
  }
  return pieces.size() == 1 ? pieces[0].contiguous() : at::cat(pieces, dim);
}

at::Tensor cp_unshard(const at::Tensor& rank_ordered, int64_t dim, int64_t cp, bool load_balanced) {
  const at::Tensor ids = chunk_ids(cp, load_balanced);
  return reorder_chunks(rank_ordered, dim, ids.numel(), at::argsort(ids));
}

at::Tensor cp_rank_order(const at::Tensor& whole, int64_t dim, int64_t cp, bool load_balanced) {
  const at::Tensor ids = chunk_ids(cp, load_balanced);
  return reorder_chunks(whole, dim, ids.numel(), ids);
}

int64_t cp_size_in_scope() {
  const DeviceMesh* mesh = current_mesh();
  const std::optional<PartitionSpec> spec =
      mesh ? resolve_logical_axes({axis::kSeqlenCp}) : std::nullopt;
  int64_t ranks = 1;
  if (spec) {
    for (const std::string& name : (*spec)[0]) ranks *= mesh->size(mesh->axis_index(name));
  }
  return ranks;
}

at::Tensor cp_packed_indices(const at::Tensor& cu_seqlens_padded, int64_t cp, int64_t rank) {
  TE_CHECK(cp >= 1 && rank >= 0 && rank < cp, "cp_packed_indices: rank ", rank, " is not one of ",
           cp);
  const at::Tensor cu = checked_cu_seqlens(cu_seqlens_padded, "context parallelism",
                                           "cu_seqlens_padded", std::numeric_limits<int64_t>::max(),
                                           /*tail_padding=*/true);
  const int64_t* pp = cu.data_ptr<int64_t>();
  std::vector<at::Tensor> pieces;
  for (int64_t i = 0; i + 1 < cu.size(0); ++i) {
    const int64_t slot = pp[i + 1] - pp[i], c = slot / (2 * cp);
    TE_CHECK(slot % (2 * cp) == 0, "context parallelism over ", cp,
             " ranks cuts each packed sequence's slot into 2·cp = ", 2 * cp,
             " chunks, but sequence ", i, " has a slot of ", slot, " tokens (cu_seqlens_padded[", i,
             "..", i + 1, "]); pad each sequence to a multiple of ", 2 * cp,
             " (TE's pad_thd_sequences_for_cp does)");
    pieces.push_back(at::arange(pp[i] + rank * c, pp[i] + (rank + 1) * c, at::kLong));
    pieces.push_back(
        at::arange(pp[i] + (2 * cp - 1 - rank) * c, pp[i] + (2 * cp - rank) * c, at::kLong));
  }
  return pieces.empty() ? at::empty({0}, at::kLong) : at::cat(pieces);
}

namespace {

int64_t packed_tokens(const at::Tensor& cu_seqlens_padded) {
  return checked_cu_seqlens(cu_seqlens_padded, "context parallelism", "cu_seqlens_padded",
                            std::numeric_limits<int64_t>::max(), /*tail_padding=*/true)
      .data_ptr<int64_t>()[cu_seqlens_padded.numel() - 1];
}

// Every rank's indices, in rank order.
at::Tensor packed_order(const at::Tensor& cu_seqlens_padded, int64_t cp) {
  std::vector<at::Tensor> all;
  for (int64_t r = 0; r < cp; ++r) all.push_back(cp_packed_indices(cu_seqlens_padded, cp, r));
  return at::cat(all);
}

}  // namespace

at::Tensor cp_shard_packed(const at::Tensor& whole, int64_t dim,
                           const at::Tensor& cu_seqlens_padded, int64_t cp, int64_t rank) {
  const int64_t tokens = packed_tokens(cu_seqlens_padded);
  TE_CHECK(whole.size(dim) == tokens, "cp_shard_packed: dim ", dim, " of ", whole.sizes(),
           " is not the whole packed tensor's ", tokens,
           " tokens (cu_seqlens_padded's last entry)");
  return whole.index_select(dim, cp_packed_indices(cu_seqlens_padded, cp, rank).to(whole.device()));
}

at::Tensor cp_unshard_packed(const at::Tensor& rank_ordered, int64_t dim,
                             const at::Tensor& cu_seqlens_padded, int64_t cp) {
  const int64_t tokens = packed_tokens(cu_seqlens_padded);
  TE_CHECK(rank_ordered.size(dim) == tokens, "cp_unshard_packed: dim ", dim, " of ",
           rank_ordered.sizes(), " is not every rank's tokens, ", tokens,
           " (cu_seqlens_padded's last entry)");
  return rank_ordered.index_select(
      dim, at::argsort(packed_order(cu_seqlens_padded, cp)).to(rank_ordered.device()));
}

at::Tensor cp_rank_order_packed(const at::Tensor& whole, int64_t dim,
                                const at::Tensor& cu_seqlens_padded, int64_t cp) {
  const int64_t tokens = packed_tokens(cu_seqlens_padded);
  TE_CHECK(whole.size(dim) == tokens, "cp_rank_order_packed: dim ", dim, " of ", whole.sizes(),
           " is not the whole packed tensor's ", tokens,
           " tokens (cu_seqlens_padded's last entry)");
  return whole.index_select(dim, packed_order(cu_seqlens_padded, cp).to(whole.device()));
}

namespace detail {

CpLayout::CpLayout(const ContextParallel& cp, int64_t local_tokens)
    : cp_(cp.size()), tokens_(local_tokens * cp.size()), load_balanced_(cp.load_balanced()) {}

CpLayout::CpLayout(const ContextParallel& cp, const PackedSequences& packed, int64_t local_tokens)
    : cp_(cp.size()), tokens_(local_tokens * cp.size()), load_balanced_(true), packed_(true) {
  const at::Tensor cu = checked_cu_seqlens(packed.cu_seqlens_q, "context parallelism",
                                           "cu_seqlens_q", tokens_, /*tail_padding=*/true);
  const at::Tensor slots =
      packed.cu_seqlens_q_padded.defined()
          ? checked_cu_seqlens(packed.cu_seqlens_q_padded, "context parallelism",
                               "cu_seqlens_q_padded", tokens_, /*tail_padding=*/true)
          : cu;
  const int64_t *c = cu.data_ptr<int64_t>(), *pp = slots.data_ptr<int64_t>();
  for (int64_t i = 0; i + 1 < cu.size(0); ++i) {
    start_.push_back(pp[i]);
    length_.push_back(c[i + 1] - c[i]);
    slot_.push_back(pp[i + 1] - pp[i]);
    longest_q_ = std::max(longest_q_, length_.back());
  }
  longest_kv_ = packed.max_seqlen_kv > 0 ? packed.max_seqlen_kv : longest_q_;
  if (packed.max_seqlen_q > 0) longest_q_ = packed.max_seqlen_q;
  order_ = packed_order(slots, cp_);
  inverse_ = at::argsort(order_);
}

std::vector<CpChunk> CpLayout::chunks(int64_t rank) const {
  if (!packed_) return cp_chunks(tokens_, cp_, rank, load_balanced_);
  std::vector<CpChunk> out;
  for (std::size_t i = 0; i < start_.size(); ++i) {
    const int64_t c = slot_[i] / (2 * cp_), base = start_[i] / cp_;
    for (const int64_t k : {rank, 2 * cp_ - 1 - rank}) {
      const int64_t valid = std::clamp(length_[i] - k * c, int64_t{0}, c);
      if (valid > 0) {
        out.push_back({k * c, valid, base + (k == rank ? 0 : c), static_cast<int64_t>(i)});
      }
    }
  }
  return out;
}

std::vector<CpChunk> CpLayout::sequences() const {
  if (!packed_) return {{0, tokens_, 0}};
  std::vector<CpChunk> out;
  for (std::size_t i = 0; i < start_.size(); ++i) {
    if (length_[i] > 0) out.push_back({0, length_[i], start_[i], static_cast<int64_t>(i)});
  }
  return out;
}

at::Tensor CpLayout::sequence_order(const at::Tensor& rank_ordered) const {
  if (!packed_) return cp_unshard(rank_ordered, 1, cp_, load_balanced_);
  return rank_ordered.index_select(1, inverse_.to(rank_ordered.device()));
}

at::Tensor CpLayout::rank_order(const at::Tensor& whole) const {
  if (!packed_) return cp_rank_order(whole, 1, cp_, load_balanced_);
  return whole.index_select(1, order_.to(whole.device()));
}

}  // namespace detail

namespace {

using detail::over_cp;

// [b, s/cp, h, d] split over the sequence -> [b, s, h/cp, d] split over the heads, and back.
at::Tensor sequence_to_heads(const at::Tensor& t, const ContextParallel& cp,
                             const detail::CpLayout& layout) {
  const DTensor x = DTensor::from_local(t, cp.mesh(), over_cp(cp, Shard{1}));
  return layout.sequence_order(x.redistribute(over_cp(cp, Shard{2})).to_local());
}
at::Tensor heads_to_sequence(const at::Tensor& t, const ContextParallel& cp,
                             const detail::CpLayout& layout) {
  return DTensor::from_local(layout.rank_order(t), cp.mesh(), over_cp(cp, Shard{2}))
      .redistribute(over_cp(cp, Shard{1}))
      .to_local();
}

// a2a's call on whole sequences of this rank's share of the heads: dropout drawn at the share's
// place among the global heads.
AttentionCall heads_share(const at::Tensor& q, const AttentionCall& call,
                          const ContextParallel& cp) {
  AttentionCall c = call;
  auto piece = std::make_shared<detail::AttentionPiece>(detail::piece_of(call));
  if (piece->global_heads == 0) piece->global_heads = q.size(2);
  piece->head_offset += cp.rank() * (q.size(2) / cp.size());
  c.piece = std::move(piece);
  return c;
}

}  // namespace

namespace {

using Attend = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        const AttentionCall&)>;

// The a2a step round `attend`: this rank's tokens of q, k, v ([batch, tokens, heads, head_dim];
// packed: a batch of one) laid out over `group` as `layout` says -> the group's tokens in their
// sequence order over this rank's share of the heads, attended (dropout drawn at the share's
// place among the heads; packed: as [tokens, heads, head_dim]), and back.
at::Tensor over_head_shares(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionCall& call, const ContextParallel& group,
                            const detail::CpLayout& layout, const Attend& attend) {
  const bool packed = call.packed.defined();
  auto longer = [&](const at::Tensor& t) {
    const at::Tensor x = sequence_to_heads(t, group, layout);
    return packed ? x.squeeze(0) : x;
  };
  const at::Tensor o = attend(longer(q), longer(k), longer(v), heads_share(q, call, group));
  return heads_to_sequence(packed ? o.unsqueeze(0) : o, group, layout);
}

}  // namespace

at::Tensor context_parallel_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const AttentionCall& call, const ContextParallel& cp) {
  detail::check_context_parallel(q, k, v, call, cp);
  if (cp.size() == 1) return attention(q, k, v, call);
  // Packed sequences as a batch of one (the blocks' token dim is 1).
  const bool packed = call.packed.defined();
  const at::Tensor q4 = packed ? q.unsqueeze(0) : q, k4 = packed ? k.unsqueeze(0) : k,
                   v4 = packed ? v.unsqueeze(0) : v;
  // Where every rank's tokens sit, over `over`'s ranks (a2a+p2p: its a2a group's, whose packed
  // slots are the whole's over the ring's size; the order is the slots').
  auto layout_over = [&](const ContextParallel& over, int64_t ring) {
    if (!packed) return detail::CpLayout(over, q.size(1));
    if (ring == 1) return detail::CpLayout(over, call.packed, q.size(0));
    const PackedSequences& p = call.packed;
    const at::Tensor slots =
        (p.cu_seqlens_q_padded.defined() ? p.cu_seqlens_q_padded : p.cu_seqlens_q)
            .to(at::kCPU, at::kLong)
            .div(ring, "floor");
    return detail::CpLayout(over, PackedSequences{slots, slots, slots, slots}, q.size(0));
  };
  at::Tensor out;
  switch (cp.comm_type()) {
    case CpCommType::kP2P:
      out = detail::ring_attention(q4, k4, v4, call, cp, layout_over(cp, 1));
      break;
    case CpCommType::kAllGather:
      out = detail::gathered_kv_attention(q4, k4, v4, call, cp, layout_over(cp, 1));
      break;
    case CpCommType::kA2A:
      out = over_head_shares(q4, k4, v4, call, cp, layout_over(cp, 1),
                             [](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                                const AttentionCall& share) { return attention(a, b, c, share); });
      break;
    case CpCommType::kA2AP2P: {
      // TE's hierarchical cp (AttnFuncWithCPAndKVP2P with [a2a group, p2p group], L1407-1511):
      // the a2a gathers each a2a group's tokens over a share of the heads; put in the group's
      // sequence order they are ring rank p's piece of the whole in the ring's own layout (load
      // balanced: chunks p and 2·P-1-p of 2·P, each the group's A chunks of 2·cp; packed: each
      // slot's ring chunks), which the ring attends and the a2a sends back.
      const ContextParallel group = cp.a2a_part(), ring = cp.ring_part();
      out = over_head_shares(q4, k4, v4, call, group, layout_over(group, ring.size()),
                             [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c,
                                 const AttentionCall& share) {
                               return context_parallel_attention(a, b, c, share, ring);
                             });
      break;
    }
  }
  TE_CHECK(out.defined(), "cp_comm_type ", static_cast<int>(cp.comm_type()),
           " is not one this build knows");
  return packed ? out.squeeze(0) : out;
}

}  // namespace te::nn::functional
