// The checks context_parallel_attention makes before any strategy moves a tensor
// (context_parallel_blocks.h): TE's refusals (context_parallel.py at d0067d0da,
// docs/research/te-context-parallel.md §1) and what te does not take yet, each a te::Error
// naming the option and what to do.

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "attention_piece.h"
#include "context_parallel_blocks.h"
#include "te/error.h"
#include "te/nn/context_parallel.h"
#include "te/nn/functional.h"

namespace te::nn::functional {

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
  const bool hierarchical = cp.comm_type() == CpCommType::kA2AP2P;
  const std::string who =
      std::string("context_parallel_attention (cp_comm_type '") + te_name(cp.comm_type()) +
      (hierarchical ? "' over mesh axes '" : "' over mesh axis '") + cp.axis() + "')";
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
  TE_CHECK(!(window && (cp.comm_type() == CpCommType::kP2P || hierarchical)), who,
           ": a sliding window (", call.spec.window_left, ", ", call.spec.window_right,
           ") is not taken by cp_comm_type '", te_name(cp.comm_type()),
           "', as TE refuses it (context_parallel.py L5057-5060 at d0067d0da); use 'all_gather' "
           "or 'a2a'");
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
  if (cp.comm_type() == CpCommType::kA2A || hierarchical) {
    const int64_t ways = hierarchical ? cp.a2a_part().size() : cp.size();
    TE_CHECK(q.size(2) % ways == 0 && k.size(2) % ways == 0, who, ": ", q.size(2),
             " query heads and ", k.size(2), " key/value heads must each divide by ",
             hierarchical ? "the a2a axis' size, " : "cp = ", ways,
             " (each rank attends over a share of the heads; TE asserts the same, "
             "context_parallel.py L4246-4249)");
    if (!hierarchical) return;  // (a2a+p2p's ring checks what it takes)
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

}  // namespace te::nn::functional
