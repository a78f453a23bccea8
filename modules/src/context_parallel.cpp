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
    : mesh_(mesh),
      axis_(axis),
      mesh_dim_(mesh.axis_index(axis)),
      comm_type_(comm_type),
      load_balanced_(load_balanced) {}

int64_t ContextParallel::size() const { return mesh_.size(mesh_dim_); }
int64_t ContextParallel::rank() const { return mesh_.coordinate(mesh_dim_); }

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

namespace detail {

namespace {

// Packed sequences (thd) under cp, as TE takes them: one set of sequences for q, k and v, each
// slot a multiple of 2·cp tokens, the local tensors every rank's share of the whole.
void check_packed_cp(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionCall& call, const ContextParallel& cp, const std::string& who) {
  TE_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3, who, ": packed q ", q.sizes(), ", k ",
           k.sizes(), ", v ", v.sizes(),
           " are not [tokens/cp, heads, head_dim] (qkv_format thd; 2-D cu_seqlens, rows of "
           "packed sequences, are not taken with context parallelism)");
  TE_CHECK(call.spec.padding() && !call.mask.defined(), who, ": qkv_format 'thd' takes a padding ",
           "mask type and no mask (cu_seqlens say where each sequence is), as TE's; got '",
           call.spec.type, "'", call.mask.defined() ? " with a mask" : "");
  const PackedSequences& p = call.packed;
  const int64_t tokens = q.size(0) * cp.size();
  auto same = [](const at::Tensor& a, const at::Tensor& b) {
    return a.defined() == b.defined() &&
           (!a.defined() ||
            (a.sizes() == b.sizes() && a.to(at::kCPU, at::kLong).equal(b.to(at::kCPU, at::kLong))));
  };
  TE_CHECK(p.cu_seqlens_q.defined() && same(p.cu_seqlens_q, p.cu_seqlens_kv) &&
               same(p.cu_seqlens_q_padded, p.cu_seqlens_kv_padded),
           who,
           ": cu_seqlens_q and cu_seqlens_kv (and their _padded) must be the same: context "
           "parallelism splits one set of packed sequences for q, k and v (self attention)");
  TE_CHECK(k.size(0) == q.size(0) && v.size(0) == q.size(0), who, ": q holds ", q.size(0),
           " tokens but k ", k.size(0), " and v ", v.size(0), "; they are one set of sequences");
  const at::Tensor& slots =
      p.cu_seqlens_q_padded.defined() ? p.cu_seqlens_q_padded : p.cu_seqlens_q;
  const char* slots_name =
      p.cu_seqlens_q_padded.defined() ? "cu_seqlens_q_padded" : "cu_seqlens_q (no _padded given)";
  const at::Tensor cu =
      checked_cu_seqlens(slots, who, slots_name, std::numeric_limits<int64_t>::max(), true);
  TE_CHECK(cu[-1].item<int64_t>() == tokens, who, ": each rank holds ", q.size(0),
           " tokens, so the whole packed tensor has cp · ", q.size(0), " = ", tokens, ", but ",
           slots_name, " ends at ", cu[-1].item<int64_t>(),
           "; the slots must cover it (make the last sequence's slot reach the end)");
  cp_packed_indices(slots, cp.size(), 0);  // each slot a multiple of 2·cp
  const at::Tensor lengths = checked_cu_seqlens(p.cu_seqlens_q, who, "cu_seqlens_q", tokens,
                                                /*tail_padding=*/true)
                                 .diff();
  TE_CHECK(cu.size(0) == lengths.size(0) + 1, who, ": ", slots_name, " has ", cu.size(0),
           " entries but cu_seqlens_q has ", lengths.size(0) + 1, ": both are [sequences + 1]");
  const at::Tensor over = (cu.diff() < lengths).nonzero();
  TE_CHECK(over.numel() == 0, who, ": sequence ", over.numel() ? over[0][0].item<int64_t>() : 0,
           " of cu_seqlens_q is longer than its slot in cu_seqlens_q_padded");
  const int64_t longest = lengths.numel() ? lengths.max().item<int64_t>() : 0;
  for (const auto& [name, given] : {std::pair<const char*, int64_t>{"max_seqlen_q", p.max_seqlen_q},
                                    {"max_seqlen_kv", p.max_seqlen_kv}}) {
    TE_CHECK(given <= 0 || given >= longest, who, ": ", name, " ", given,
             " is shorter than the longest sequence (", longest, " tokens)");
  }
}

}  // namespace

void check_context_parallel(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                            const AttentionCall& call, const ContextParallel& cp) {
  const std::string who = std::string("context_parallel_attention (cp_comm_type '") +
                          te_name(cp.comm_type()) + "' over mesh axis '" + cp.axis() + "')";
  const bool packed = call.packed.defined();
  if (packed) check_packed_cp(q_in, k_in, v_in, call, cp, who);
  // Packed sequences: a batch of one.
  const at::Tensor q = packed ? q_in.unsqueeze(0) : q_in, k = packed ? k_in.unsqueeze(0) : k_in,
                   v = packed ? v_in.unsqueeze(0) : v_in;
  TE_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, who, ": q ", q.sizes(), ", k ", k.sizes(),
           ", v ", v.sizes(), " are not [batch, seqlen/cp, heads, head_dim] (bshd)");
  TE_CHECK(k.size(1) == q.size(1) && v.size(1) == q.size(1), who, ": q holds ", q.size(1),
           " tokens but k ", k.size(1), " and v ", v.size(1),
           "; context parallelism splits one sequence for q, k and v alike (self attention)");
  TE_CHECK(q.size(0) == k.size(0) && k.size(0) == v.size(0) && q.size(3) == k.size(3) &&
               k.size(2) == v.size(2) && k.size(2) > 0 && q.size(2) % k.size(2) == 0,
           who, ": q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(),
           " are not [b, s, h, d], [b, s, hkv, d], [b, s, hkv, dv] with h a multiple of hkv");
  TE_CHECK(call.softcap >= 0 && std::isfinite(call.softcap), who, ": softcap ", call.softcap,
           " must be a finite number >= 0 (0: none)");
  TE_CHECK(!piece_of(call).on_logits && (packed || piece_of(call).global_sequences == 0), who,
           ": internal: a logits constraint, or packed rows without packed sequences, are set");
  // TE refuses every mask with cp in bshd/sbhd (backends.py L2169-2172 at d0067d0da); te takes
  // the padding types (one mask for every head, over the whole sequence), cut per block.
  TE_CHECK(call.spec.type != AttnMaskType::kArbitrary, who,
           ": attn_mask_type 'arbitrary' is not taken with context parallelism (TE takes no mask "
           "with cp in bshd); use no_mask, a causal type or a padding type");
  // The padding mask is the whole sequence's, as one process takes it.
  if (!packed) {
    check_attention_mask(call.mask, call.spec, q.size(0), q.size(2), q.size(1) * cp.size(),
                         q.size(1) * cp.size());
  }
  TE_CHECK(call.bias_type == AttnBiasType::kNoBias, who, ": core_attention_bias_type '",
           te_name(call.bias_type), "' is not taken with context parallelism; use no_bias");
  const bool window =
      call.spec.window_left >= 0 || (!call.spec.causal() && call.spec.window_right >= 0);
  TE_CHECK(!(window && cp.comm_type() == CpCommType::kP2P), who, ": a sliding window (",
           call.spec.window_left, ", ", call.spec.window_right,
           ") is not taken by cp_comm_type 'p2p', as TE refuses it (context_parallel.py "
           "L5057-5060 at d0067d0da); use 'all_gather' or 'a2a'");
  TE_CHECK(cp.comm_type() == CpCommType::kA2A || call.softmax_type == SoftmaxType::kVanilla, who,
           ": softmax_type '", te_name(call.softmax_type),
           "' is taken with cp_comm_type 'a2a' only, as TE's (context_parallel.py L5062-5067)");
  TE_CHECK(call.softmax_type != SoftmaxType::kLearnable, who,
           ": softmax_type 'learnable' (sink logits per head, which a2a would split with the "
           "heads) is not taken with context parallelism yet; use 'off-by-one' or 'vanilla'");
  if (cp.load_balanced() && cp.size() > 1 && !packed) {
    TE_CHECK(q.size(1) % 2 == 0, who, ": each rank holds ", q.size(1),
             " tokens, an odd number: the load-balanced layout gives each rank two equal chunks "
             "(a sequence divisible by 2·cp = ",
             2 * cp.size(), ")");
  }
  if (cp.comm_type() == CpCommType::kA2A) {
    TE_CHECK(q.size(2) % cp.size() == 0 && k.size(2) % cp.size() == 0, who, ": ", q.size(2),
             " query heads and ", k.size(2),
             " key/value heads must each divide by cp = ", cp.size(),
             " (each rank attends over a share of the heads; TE asserts the same, "
             "context_parallel.py L4246-4249)");
    return;
  }
  const at::ScalarType t = q.scalar_type();
  TE_CHECK((q.device().is_cpu() || q.is_meta()) &&
               (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf) && k.scalar_type() == t &&
               v.scalar_type() == t,
           who,
           ": runs te's fused CPU kernel, which takes float32, bfloat16 or float16 CPU "
           "tensors of one dtype; got q ",
           t, " on ", q.device(), ", k ", k.scalar_type(), ", v ", v.scalar_type(),
           " (use cp_comm_type 'a2a' for others)");
}

}  // namespace detail

at::Tensor context_parallel_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const AttentionCall& call, const ContextParallel& cp) {
  detail::check_context_parallel(q, k, v, call, cp);
  if (cp.size() == 1) return attention(q, k, v, call);
  // Packed sequences as a batch of one (the blocks' token dim is 1).
  const bool packed = call.packed.defined();
  const at::Tensor q4 = packed ? q.unsqueeze(0) : q, k4 = packed ? k.unsqueeze(0) : k,
                   v4 = packed ? v.unsqueeze(0) : v;
  const detail::CpLayout layout =
      packed ? detail::CpLayout(cp, call.packed, q.size(0)) : detail::CpLayout(cp, q.size(1));
  at::Tensor out;
  switch (cp.comm_type()) {
    case CpCommType::kP2P:
      out = detail::ring_attention(q4, k4, v4, call, cp, layout);
      break;
    case CpCommType::kAllGather:
      out = detail::gathered_kv_attention(q4, k4, v4, call, cp, layout);
      break;
    case CpCommType::kA2A: {
      auto whole = [&](const at::Tensor& t) {
        const at::Tensor x = sequence_to_heads(t, cp, layout);
        return packed ? x.squeeze(0) : x;
      };
      const at::Tensor o = attention(whole(q4), whole(k4), whole(v4), heads_share(q4, call, cp));
      out = heads_to_sequence(packed ? o.unsqueeze(0) : o, cp, layout);
      break;
    }
  }
  TE_CHECK(out.defined(), "cp_comm_type ", static_cast<int>(cp.comm_type()),
           " is not one this build knows");
  return packed ? out.squeeze(0) : out;
}

}  // namespace te::nn::functional
