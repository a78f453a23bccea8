#pragma once

// The block-wise strategies of context parallel attention (context_parallel_blocks.cpp; the
// unfused path's blocks: context_parallel_unfused.cpp), the layout of every rank's tokens and
// the checks every strategy makes first (context_parallel_checks.cpp): internal to te::nn.

#include <ATen/Tensor.h>
#include <torch/csrc/autograd/custom_function.h>

#include <utility>
#include <vector>

#include "flash_attention.h"
#include "te/distributed/placement.h"
#include "te/distributed/scopes.h"
#include "te/nn/context_parallel.h"
#include "te/nn/functional.h"

namespace te::nn::functional::detail {

/// Where every rank's tokens sit (dim 1 of [batch, tokens, heads, head_dim]; a packed q is
/// viewed as a batch of one): one sequence in cp_chunks' layout, or packed sequences in TE's thd
/// layout. The chunks hold valid tokens only (a packed sequence's padding is in none).
class CpLayout {
 public:
  /// A batch of whole sequences, `local_tokens` a rank.
  CpLayout(const ContextParallel& cp, int64_t local_tokens);
  /// Packed sequences (checked: check_context_parallel names what does not fit).
  CpLayout(const ContextParallel& cp, const PackedSequences& packed, int64_t local_tokens);

  bool packed() const { return packed_; }
  /// The whole's tokens (a sequence's, or the packed tensor's).
  int64_t tokens() const { return tokens_; }
  /// Rank `rank`'s chunks, in the order they sit in its tokens.
  std::vector<CpChunk> chunks(int64_t rank) const;
  /// Each sequence whole, where it sits in the whole (sequence_order) tensor.
  std::vector<CpChunk> sequences() const;
  /// Every rank's tokens along dim 1 in rank order -> the whole, and back. Differentiable.
  at::Tensor sequence_order(const at::Tensor& rank_ordered) const;
  at::Tensor rank_order(const at::Tensor& whole) const;
  /// Packed: the sequences' count and the longest (or max_seqlen_q / max_seqlen_kv), where each
  /// draws dropout (one process's [sequences, heads, longest_q, longest_kv]).
  int64_t count() const { return static_cast<int64_t>(start_.size()); }
  int64_t longest_q() const { return longest_q_; }
  int64_t longest_kv() const { return longest_kv_; }

 private:
  int64_t cp_, tokens_;
  bool load_balanced_, packed_ = false;
  std::vector<int64_t> start_, length_, slot_;  // packed: per sequence
  int64_t longest_q_ = 0, longest_kv_ = 0;
  at::Tensor order_, inverse_;  // packed: the whole's index of each rank-ordered token, and back
};

/// Placements that put `p` on cp's mesh dim and Replicate on every other (a redistribute of
/// them moves along cp's axis only).
std::vector<Placement> over_cp(const ContextParallel& cp, Placement p);

// What a strategy's backward needs besides the tensors.
struct CpState : torch::CustomClassHolder {
  CpState(const ContextParallel& c, CpLayout l, double s, KeyWindow w)
      : cp(c), layout(std::move(l)), scale(s), window(w) {}
  ContextParallel cp;
  CpLayout layout;
  double scale;
  KeyWindow window;  // the call's, for a whole sequence (offset 0)
  ScopeCapture scopes = ScopeCapture::current();
};
/// The CpState a strategy's forward saved as ctx->saved_data["state"].
c10::intrusive_ptr<CpState> state_of(torch::autograd::AutogradContext* ctx);

/// The window query chunk `q` sees key chunk `k` through: the call's, moved by their distance.
KeyWindow between(const KeyWindow& w, const CpChunk& q, const CpChunk& k);
/// Whether some query of chunk `q` sees some key of chunk `k` (of the same sequence).
bool sees(const KeyWindow& w, const CpChunk& q, const CpChunk& k);
/// Chunk c's rows of t [b, tokens, h, d] (of an lse [b, h, tokens]).
at::Tensor rows(const at::Tensor& t, const CpChunk& c);
at::Tensor lse_rows(const at::Tensor& lse, const CpChunk& c);
/// K and V as one buffer (one message a ring step, as TE's p2p_comm_buffers), and back.
at::Tensor packed(const at::Tensor& k, const at::Tensor& v);
std::pair<at::Tensor, at::Tensor> unpacked(const at::Tensor& kv, const at::Tensor& k_like,
                                           const at::Tensor& v_like);
/// Every rank's tokens of `t` along dim 1, in the sequences' own order; and whole-sequence
/// gradients summed over the ranks, each rank keeping its own tokens.
at::Tensor gathered(const at::Tensor& t, const CpState& state);
at::Tensor scattered(const at::Tensor& whole, const CpState& state);
/// p2p (`ring`) or all_gather by the unfused path under autograd, for what te's fused kernel
/// does not take (a padding mask, dropout in training, a soft cap, `fused` off).
at::Tensor unfused_blocks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionCall& call, const c10::intrusive_ptr<CpState>& state,
                          bool ring);

/// te::Error naming what context_parallel_attention cannot take (TE's refusals, and what te
/// does not take yet).
void check_context_parallel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionCall& call, const ContextParallel& cp);
/// cp_comm_type "p2p": K/V round the ring, partial results merged by log-sum-exp (te's fused
/// kernel; the unfused path, K/V received round the ring first, for what it does not take).
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionCall& call, const ContextParallel& cp,
                          const CpLayout& layout);
/// cp_comm_type "all_gather": K/V gathered, each query chunk attending once.
at::Tensor gathered_kv_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const AttentionCall& call, const ContextParallel& cp,
                                 const CpLayout& layout);

}  // namespace te::nn::functional::detail
