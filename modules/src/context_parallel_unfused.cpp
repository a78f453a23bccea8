// Context parallel attention's blocks on the unfused path under autograd (p2p and all_gather),
// for what te's fused kernel does not take: padding masks, dropout in training, soft caps,
// `fused` off. Each block pair is functional::attention's unfused path with its log-sum-exp
// (detail::unfused_attention), its mask made explicit for the pair and its dropout drawn at the
// pair's global place; the partial results merge by log-sum-exp, differentiably.

#include <ATen/ATen.h>

#include <tuple>
#include <utility>
#include <vector>

#include "attention_piece.h"
#include "context_parallel_blocks.h"
#include "te/nn/functional.h"
#include "te/nn/random.h"

namespace te::nn::functional::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The K/V blocks (packed) of ranks r, r-1, ..., r-(cp-1), the others received round the ring in
// cp-1 steps, as p2p's forward passes them. The rank's own block is one of the outputs (a copy),
// so that this node is in every rank's graph through the diagonal block, which every query
// chunk sees: its backward's ring steps then run on every rank, also where no query saw a
// received block. Backward returns each block's gradient to its owner: running sums travel back
// one hop a step, each step adding the gradient of the block one hop further away.
struct RingBlocks : public torch::autograd::Function<RingBlocks> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& kv,
                               c10::intrusive_ptr<CpState> state) {
    const ContextParallel& cp = state->cp;
    variable_list blocks = {kv.clone()};
    at::Tensor at_hand = kv;
    for (int64_t i = 1; i < cp.size(); ++i) {
      at_hand = cp.mesh().ring_shift(at_hand, cp.mesh_dim(), 1);
      blocks.push_back(at_hand);
    }
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    ctx->saved_data["numel"] = kv.numel();
    ctx->saved_data["dtype"] = static_cast<int64_t>(kv.scalar_type());
    ctx->saved_data["device"] = kv.device();
    return blocks;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const c10::intrusive_ptr<CpState> state = state_of(ctx);
    const ScopeLoan loan(state->scopes);
    const ContextParallel& cp = state->cp;
    // The sums in float32, as the fused ring's (a block no query saw has no gradient: zeros
    // travel in its place, every rank shifting).
    at::Tensor running = at::zeros(
        {ctx->saved_data["numel"].toInt()},
        at::TensorOptions().dtype(at::kFloat).device(ctx->saved_data["device"].toDevice()));
    for (int64_t i = cp.size() - 1; i >= 1; --i) {
      const at::Tensor& g = grads[static_cast<std::size_t>(i)];
      if (g.defined()) running.add_(g);
      running = cp.mesh().ring_shift(running, cp.mesh_dim(), -1);
    }
    if (grads[0].defined()) running.add_(grads[0]);
    return {running.to(static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt())),
            at::Tensor()};
  }
};

// all_gather's K or V: every rank's tokens gathered, each rank's gradient of them a partial sum
// (its queries' share), reduce-scattered back to the tokens' owners.
struct GatheredTokens : public torch::autograd::Function<GatheredTokens> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& t,
                               c10::intrusive_ptr<CpState> state) {
    at::Tensor whole = gathered(t, *state);
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return {whole};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const c10::intrusive_ptr<CpState> state = state_of(ctx);
    const ScopeLoan loan(state->scopes);
    return {scattered(grads[0].contiguous(), *state), at::Tensor()};
  }
};

// One query chunk's partial results over blocks of keys merged by log-sum-exp, differentiably
// (the unfused path's lse is finite: a row that sees nothing in a block weighs ~e^-1e10).
at::Tensor merged_rows(const std::vector<std::pair<at::Tensor, at::Tensor>>& parts,
                       const at::Tensor& q_rows, int64_t dv) {
  if (parts.empty())
    return at::zeros({q_rows.size(0), q_rows.size(1), q_rows.size(2), dv}, q_rows.options());
  if (parts.size() == 1) return parts[0].first;
  std::vector<at::Tensor> lses;
  for (const auto& p : parts) lses.push_back(p.second);
  const at::Tensor lse = at::logsumexp(at::stack(lses), 0);
  at::Tensor out;
  for (const auto& [o, l] : parts) {
    const at::Tensor term = o.to(at::kFloat) * at::exp(l - lse).transpose(1, 2).unsqueeze(-1);
    out = out.defined() ? out + term : term;
  }
  return out.to(q_rows.scalar_type());
}

// The unfused path's call for query chunk `a` against key chunk `b` (of one sequence): the call's
// mask made explicit for the pair (`masked`, the whole sequence's hidden positions, when the
// call has a padding mask), its dropout drawn at the pair's global place (a packed sequence's:
// its row of one process's [sequences, heads, longest, longest]).
AttentionCall pair_call(const AttentionCall& call, const CpState& state, const at::Tensor& masked,
                        const CpChunk& a, const CpChunk& b, const at::Tensor& q) {
  AttentionCall c = call;
  const KeyWindow w = between(state.window, a, b);
  c.spec = MaskSpec{};
  if (masked.defined()) {
    c.spec.type = AttnMaskType::kArbitrary;
    c.mask = masked.narrow(2, a.start, a.length).narrow(3, b.start, b.length);
  } else if (w.left >= 0 || w.right >= 0) {
    // Key j is hidden from query i when d = j - i - offset < -left or > right: min(d + left, 0)
    // - max(d - right, 0) is then nonzero (ops a meta tensor takes too: te::nn::plan).
    const at::TensorOptions longs = q.options().dtype(at::kLong);
    const at::Tensor d = at::arange(b.length, longs).view({1, -1}) -
                         at::arange(a.length, longs).view({-1, 1}) - w.offset;
    at::Tensor out_of_window = at::zeros({a.length, b.length}, longs);
    if (w.left >= 0) out_of_window = out_of_window + (d + w.left).clamp_max(0);
    if (w.right >= 0) out_of_window = out_of_window - (d - w.right).clamp_min(0);
    c.spec.type = AttnMaskType::kArbitrary;
    c.mask = out_of_window.ne(0).view({1, 1, a.length, b.length});
  }
  const CpLayout& layout = state.layout;
  auto piece = std::make_shared<AttentionPiece>(
      layout.packed() ? packed_sequence_piece(call, a.sequence, layout.count(), layout.longest_q(),
                                              layout.longest_kv())
                      : piece_of(call));
  if (!layout.packed()) piece->global_seqlen_q = piece->global_seqlen_kv = layout.tokens();
  piece->seqlen_q_offset = a.start;
  piece->seqlen_kv_offset = b.start;
  c.piece = std::move(piece);
  return c;
}

// Each query chunk's output at its place in the rank's `tokens` rows (zeros between: a packed
// sequence's padding), differentiably.
at::Tensor placed(const std::vector<at::Tensor>& outs, const std::vector<CpChunk>& mine,
                  int64_t tokens, const at::Tensor& like) {
  std::vector<at::Tensor> pieces;
  int64_t at_row = 0;
  auto gap = [&](int64_t rows) {
    if (rows > 0)
      pieces.push_back(at::zeros({like.size(0), rows, like.size(2), like.size(3)}, like.options()));
  };
  for (std::size_t a = 0; a < mine.size(); ++a) {
    gap(mine[a].offset - at_row);
    pieces.push_back(outs[a]);
    at_row = mine[a].offset + mine[a].length;
  }
  gap(tokens - at_row);
  return pieces.size() == 1 ? pieces[0] : at::cat(pieces, 1);
}

}  // namespace

// p2p (`ring`) or all_gather by the unfused path under autograd: every block pair replays the
// call's one dropout draw (the stream then advances by one, as one process's single call).
at::Tensor unfused_blocks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionCall& call, const c10::intrusive_ptr<CpState>& state,
                          bool ring) {
  const ContextParallel& cp = state->cp;
  const CpLayout& layout = state->layout;
  const int64_t n = cp.size(), r = cp.rank(), s = layout.tokens();
  const auto mine = layout.chunks(r);
  // Each step's keys: (its K, its V, the chunks they hold).
  std::vector<std::tuple<at::Tensor, at::Tensor, std::vector<CpChunk>>> steps;
  if (ring) {
    const variable_list blocks = RingBlocks::apply(packed(k, v), state);
    for (int64_t i = 0; i < n; ++i) {
      const auto [kk, vv] = unpacked(blocks[static_cast<std::size_t>(i)], k, v);
      steps.emplace_back(kk, vv, layout.chunks((r - i + n) % n));
    }
  } else {
    steps.emplace_back(GatheredTokens::apply(k, state)[0], GatheredTokens::apply(v, state)[0],
                       layout.sequences());
  }
  // A padding mask: the whole sequence's hidden positions, cut per pair; a pair is skipped by
  // the window unless the diagonal sits per sequence (padding_causal_bottom_right).
  at::Tensor masked = call.spec.takes_mask()
                          ? masked_positions(call.mask, call.spec, s, s, q.options())
                          : at::Tensor();
  if (masked.defined()) masked = masked.expand({masked.size(0), masked.size(1), s, s});
  const KeyWindow skip =
      call.spec.padding() && call.spec.bottom_right ? KeyWindow{} : state->window;
  const bool draws = call.training && call.dropout > 0;
  const RngState before = rng_state();
  std::vector<at::Tensor> outs;
  for (const CpChunk& a : mine) {
    std::vector<std::pair<at::Tensor, at::Tensor>> parts;
    for (const auto& [kk, vv, theirs] : steps) {
      for (const CpChunk& b : theirs) {
        if (!sees(skip, a, b)) continue;
        if (draws) set_rng_state(before);
        parts.push_back(unfused_attention(rows(q, a), rows(kk, b), rows(vv, b),
                                          pair_call(call, *state, masked, a, b, q), true));
      }
    }
    outs.push_back(merged_rows(parts, rows(q, a), v.size(3)));
  }
  if (draws) set_rng_state({before.seed, before.calls + 1});
  const at::Tensor out = placed(outs, mine, q.size(1), q);
  if (!mine.empty()) return out;
  // A rank holding only padding still takes part in the exchanges' backward, which the other
  // ranks wait in: its zeros depend on its queries and the keys it was sent (by sums over none
  // of them), as one process's padding rows do.
  const auto& [kk, vv, theirs] = steps[0];
  const at::Tensor none =
      q.narrow(1, 0, 0).sum() + kk.narrow(1, 0, 0).sum() + vv.narrow(1, 0, 0).sum();
  return out + none.to(out.scalar_type());
}

}  // namespace te::nn::functional::detail
