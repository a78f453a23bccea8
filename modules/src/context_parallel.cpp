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

#include <cmath>
#include <string>
#include <utility>

#include "attention_piece.h"
#include "context_parallel_blocks.h"
#include "te/distributed/dtensor.h"
#include "te/error.h"
#include "te/nn/functional.h"

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

namespace {

using detail::over_cp;

// [b, s/cp, h, d] split over the sequence -> [b, s, h/cp, d] split over the heads, and back.
at::Tensor sequence_to_heads(const at::Tensor& t, const ContextParallel& cp) {
  const DTensor x = DTensor::from_local(t, cp.mesh(), over_cp(cp, Shard{1}));
  return cp_unshard(x.redistribute(over_cp(cp, Shard{2})).to_local(), 1, cp.size(),
                    cp.load_balanced());
}
at::Tensor heads_to_sequence(const at::Tensor& t, const ContextParallel& cp) {
  const at::Tensor ranked = cp_rank_order(t, 1, cp.size(), cp.load_balanced());
  return DTensor::from_local(ranked, cp.mesh(), over_cp(cp, Shard{2}))
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

void check_context_parallel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionCall& call, const ContextParallel& cp) {
  const std::string who = std::string("context_parallel_attention (cp_comm_type '") +
                          te_name(cp.comm_type()) + "' over mesh axis '" + cp.axis() + "')";
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
  TE_CHECK(!call.packed.defined(), who,
           ": packed sequences (thd) are not taken with context parallelism yet; use bshd");
  TE_CHECK(!piece_of(call).on_logits && piece_of(call).global_sequences == 0, who,
           ": internal: a logits constraint or packed rows are set (not taken with cp)");
  // TE refuses every mask with cp in bshd/sbhd (backends.py L2169-2172 at d0067d0da); te takes
  // the padding types (one mask for every head, over the whole sequence), cut per block.
  TE_CHECK(call.spec.type != AttnMaskType::kArbitrary, who,
           ": attn_mask_type 'arbitrary' is not taken with context parallelism (TE takes no mask "
           "with cp in bshd); use no_mask, a causal type or a padding type");
  // The padding mask is the whole sequence's, as one process takes it.
  check_attention_mask(call.mask, call.spec, q.size(0), q.size(2), q.size(1) * cp.size(),
                       q.size(1) * cp.size());
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
  if (cp.load_balanced() && cp.size() > 1) {
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
  switch (cp.comm_type()) {
    case CpCommType::kP2P:
      return detail::ring_attention(q, k, v, call, cp);
    case CpCommType::kAllGather:
      return detail::gathered_kv_attention(q, k, v, call, cp);
    case CpCommType::kA2A:
      return heads_to_sequence(attention(sequence_to_heads(q, cp), sequence_to_heads(k, cp),
                                         sequence_to_heads(v, cp), heads_share(q, call, cp)),
                               cp);
  }
  TE_FAIL("cp_comm_type ", static_cast<int>(cp.comm_type()), " is not one this build knows");
}

}  // namespace te::nn::functional
