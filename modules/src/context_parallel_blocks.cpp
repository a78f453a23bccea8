// The block-wise context parallel strategies, "p2p" and "all_gather" (context_parallel.cpp says
// how they relate to TE's), on te's fused CPU kernel's forward and backward primitives
// (flash_attention.h); and, for what that kernel does not take (a padding mask, dropout in
// training, a soft cap, `fused` off), the same blocks on the unfused path under autograd.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <future>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attention_piece.h"
#include "context_parallel_blocks.h"
#include "flash_attention.h"
#include "te/distributed/dtensor.h"
#include "te/distributed/scopes.h"
#include "te/error.h"
#include "te/nn/functional.h"
#include "te/nn/random.h"

namespace te::nn::functional::detail {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What a strategy's backward needs besides the tensors.
struct CpState : torch::CustomClassHolder {
  CpState(const ContextParallel& c, double s, KeyWindow w) : cp(c), scale(s), window(w) {}
  ContextParallel cp;
  double scale;
  KeyWindow window;  // the call's, for the whole sequence (offset 0)
  ScopeCapture scopes = ScopeCapture::current();
};

c10::intrusive_ptr<CpState> state_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<CpState>(ctx->saved_data["state"].toCapsule());
}

// The window query chunk `q` sees key chunk `k` through: the call's, moved by their distance.
KeyWindow between(const KeyWindow& w, const CpChunk& q, const CpChunk& k) {
  return {w.offset + q.start - k.start, w.left, w.right};
}

// Whether some query of chunk `q` sees some key of chunk `k`.
bool sees(const KeyWindow& w, const CpChunk& q, const CpChunk& k) {
  const KeyWindow b = between(w, q, k);
  if (b.right >= 0 && b.offset + q.length - 1 + b.right < 0) return false;  // all keys after
  if (b.left >= 0 && k.length - 1 < b.offset - b.left) return false;        // all keys before
  return true;
}

// The next ring step's exchange, in flight on a thread of its own while this step's blocks
// compute (TE posts it before computing, context_parallel.py L1705-1715); the thread records
// into the caller's CommTrace, and receives into a buffer allocated here (on the caller's
// thread, whose allocations are its memory). get() waits for it (and rethrows its error).
class InFlight {
 public:
  InFlight() = default;
  InFlight(const ContextParallel& cp, at::Tensor t) {
    const ScopeCapture scopes = ScopeCapture::current();
    at::Tensor into = at::empty_like(t);
    result_ = std::async(std::launch::async, [&cp, t = std::move(t), into, scopes] {
      const ScopeLoan loan(scopes);
      const at::NoGradGuard no_grad;  // (grad mode is per thread)
      return cp.mesh().ring_shift(t, cp.mesh_dim(), 1, into);
    });
  }
  InFlight(InFlight&&) = default;
  InFlight& operator=(InFlight&&) = default;
  ~InFlight() {
    if (result_.valid()) result_.wait();  // never leave a send behind (an error path)
  }
  at::Tensor get() { return result_.valid() ? result_.get() : at::Tensor(); }

 private:
  std::future<at::Tensor> result_;
};

at::Tensor rows(const at::Tensor& t, const CpChunk& c) { return t.narrow(1, c.offset, c.length); }
at::Tensor lse_rows(const at::Tensor& lse, const CpChunk& c) {
  return lse.narrow(2, c.offset, c.length);
}

// K and V as one buffer (one message a ring step, as TE's p2p_comm_buffers), and back.
at::Tensor packed(const at::Tensor& k, const at::Tensor& v) {
  return at::cat({k.reshape({-1}), v.reshape({-1})});
}
std::pair<at::Tensor, at::Tensor> unpacked(const at::Tensor& kv, const at::Tensor& k_like,
                                           const at::Tensor& v_like) {
  return {kv.narrow(0, 0, k_like.numel()).view(k_like.sizes()),
          kv.narrow(0, k_like.numel(), v_like.numel()).view(v_like.sizes())};
}

// Partial results of one query chunk merged by their log-sum-exp (float32): lse = log Σ e^lse_j,
// out = Σ e^(lse_j - lse) out_j; a row that sees no key keeps a zero output and lse -inf.
std::pair<at::Tensor, at::Tensor> merged(
    const std::vector<std::pair<at::Tensor, at::Tensor>>& parts, const at::Tensor& q_rows,
    int64_t dv) {
  const at::TensorOptions f32 = q_rows.options().dtype(at::kFloat);
  if (parts.empty()) {
    return {at::zeros({q_rows.size(0), q_rows.size(1), q_rows.size(2), dv}, f32),
            at::full({q_rows.size(0), q_rows.size(2), q_rows.size(1)},
                     -std::numeric_limits<float>::infinity(), f32)};
  }
  std::vector<at::Tensor> lses;
  for (const auto& p : parts) lses.push_back(p.second);
  const at::Tensor lse = at::logsumexp(at::stack(lses), 0);
  const at::Tensor finite = at::where(at::isinf(lse), at::zeros_like(lse), lse);
  at::Tensor out = at::zeros_like(parts[0].first);
  for (const auto& [o, l] : parts) {
    out.add_(o * at::exp(l - finite).transpose(1, 2).unsqueeze(-1));  // [b, s, h, 1]
  }
  return {out, lse};
}

// The forward's output from each query chunk's (out, lse), saved for backward with q, k, v.
variable_list saved_result(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v,
                           const std::vector<std::pair<at::Tensor, at::Tensor>>& chunks,
                           c10::intrusive_ptr<CpState> state) {
  std::vector<at::Tensor> outs, lses;
  for (const auto& [o, l] : chunks) {
    outs.push_back(o);
    lses.push_back(l);
  }
  const at::Tensor out = at::cat(outs, 1).to(q.scalar_type());
  ctx->save_for_backward({q, k, v, out, at::cat(lses, 2)});
  ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
  return {out};
}

// What a strategy's backward reads.
struct Saved {
  c10::intrusive_ptr<CpState> state;
  at::Tensor q, k, v, out, lse, dout;
};
Saved saved_of(AutogradContext* ctx, const variable_list& grads) {
  const auto t = ctx->get_saved_variables();
  return {state_of(ctx),
          t[0],
          t[1],
          t[2],
          t[3],
          t[4],
          grads[0].defined() ? grads[0] : at::zeros_like(t[3])};
}

// ---- p2p --------------------------------------------------------------------------------------

struct Ring : public torch::autograd::Function<Ring> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, c10::intrusive_ptr<CpState> state) {
    const ContextParallel& cp = state->cp;
    const int64_t n = cp.size(), r = cp.rank(), s = q.size(1) * n;
    const auto mine = cp_chunks(s, n, r, cp.load_balanced());
    std::vector<std::vector<std::pair<at::Tensor, at::Tensor>>> parts(mine.size());
    at::Tensor kv = packed(k, v);
    for (int64_t i = 0; i < n; ++i) {
      InFlight next = i + 1 < n ? InFlight(cp, kv) : InFlight();
      const auto [kk, vv] = unpacked(kv, k, v);
      const auto theirs = cp_chunks(s, n, (r - i + n) % n, cp.load_balanced());
      for (std::size_t a = 0; a < mine.size(); ++a) {
        for (const CpChunk& b : theirs) {
          if (!sees(state->window, mine[a], b)) continue;
          parts[a].push_back(flash_forward(rows(q, mine[a]), rows(kk, b), rows(vv, b), state->scale,
                                           between(state->window, mine[a], b)));
        }
      }
      kv = next.get();
    }
    std::vector<std::pair<at::Tensor, at::Tensor>> chunks;
    for (std::size_t a = 0; a < mine.size(); ++a) {
      chunks.push_back(merged(parts[a], rows(q, mine[a]), v.size(3)));
    }
    return saved_result(ctx, q, k, v, chunks, std::move(state));
  }

  // K/V pass round the ring again; the running sum of a block's dK/dV travels one hop behind
  // it and reaches the block's owner after the last step.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Saved x = saved_of(ctx, grads);
    const ScopeLoan loan(x.state->scopes);
    const CpState* s_ = x.state.get();
    const ContextParallel& cp = s_->cp;
    const at::Tensor &q = x.q, &k = x.k, &v = x.v, &out = x.out, &lse = x.lse, &dout = x.dout;
    const int64_t n = cp.size(), r = cp.rank(), s = q.size(1) * n;
    const auto mine = cp_chunks(s, n, r, cp.load_balanced());
    at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    const at::TensorOptions f32 = k.options().dtype(at::kFloat);
    at::Tensor kv = packed(k, v), running;
    for (int64_t i = 0; i < n; ++i) {
      InFlight next = i + 1 < n ? InFlight(cp, kv) : InFlight();
      const auto [kk, vv] = unpacked(kv, k, v);
      at::Tensor dk = at::zeros(k.sizes(), f32), dv = at::zeros(v.sizes(), f32);
      const auto theirs = cp_chunks(s, n, (r - i + n) % n, cp.load_balanced());
      for (const CpChunk& a : mine) {
        for (const CpChunk& b : theirs) {
          if (!sees(s_->window, a, b)) continue;
          auto [gq, gk, gv] =
              flash_backward(rows(q, a), rows(kk, b), rows(vv, b), rows(out, a), rows(dout, a),
                             lse_rows(lse, a), at::Tensor(), s_->scale, between(s_->window, a, b));
          rows(dq, a).add_(gq);
          rows(dk, b).add_(gk);
          rows(dv, b).add_(gv);
        }
      }
      const at::Tensor share = packed(dk, dv);
      running = i == 0 ? share : running.add_(share);
      kv = next.get();  // (one exchange at a time on the row: every rank posts them in one order)
      running = cp.mesh().ring_shift(running, cp.mesh_dim(), 1);
    }
    const auto [dk, dv] = unpacked(running, k, v);
    return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), at::Tensor()};
  }
};

// ---- all_gather -------------------------------------------------------------------------------

// Every rank's tokens of `t` along dim 1, in the sequence's own order.
at::Tensor gathered(const at::Tensor& t, const ContextParallel& cp) {
  const at::Tensor ranked = DTensor::from_local(t, cp.mesh(), over_cp(cp, Shard{1}))
                                .redistribute(over_cp(cp, Replicate{}))
                                .to_local();
  return cp_unshard(ranked, 1, cp.size(), cp.load_balanced());
}

// Whole-sequence gradients summed over the ranks, each rank keeping its own tokens.
at::Tensor scattered(const at::Tensor& whole, const ContextParallel& cp) {
  const at::Tensor ranked = cp_rank_order(whole, 1, cp.size(), cp.load_balanced());
  return DTensor::from_local(ranked, cp.mesh(), over_cp(cp, Partial{}))
      .redistribute(over_cp(cp, Shard{1}))
      .to_local();
}

struct GatheredKv : public torch::autograd::Function<GatheredKv> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, c10::intrusive_ptr<CpState> state) {
    const ContextParallel& cp = state->cp;
    const at::Tensor kk = gathered(k, cp), vv = gathered(v, cp);
    const CpChunk whole{0, kk.size(1), 0};
    std::vector<std::pair<at::Tensor, at::Tensor>> chunks;
    for (const CpChunk& a : cp_chunks(kk.size(1), cp.size(), cp.rank(), cp.load_balanced())) {
      chunks.push_back(
          flash_forward(rows(q, a), kk, vv, state->scale, between(state->window, a, whole)));
    }
    return saved_result(ctx, q, k, v, chunks, std::move(state));  // K/V gathered again later
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Saved x = saved_of(ctx, grads);
    const ScopeLoan loan(x.state->scopes);
    const CpState* s_ = x.state.get();
    const ContextParallel& cp = s_->cp;
    const at::Tensor &q = x.q, &k = x.k, &v = x.v, &out = x.out, &lse = x.lse, &dout = x.dout;
    const at::Tensor kk = gathered(k, cp), vv = gathered(v, cp);
    const CpChunk whole{0, kk.size(1), 0};
    at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    at::Tensor dk = at::zeros(kk.sizes(), dq.options()), dv = at::zeros(vv.sizes(), dq.options());
    for (const CpChunk& a : cp_chunks(kk.size(1), cp.size(), cp.rank(), cp.load_balanced())) {
      auto [gq, gk, gv] =
          flash_backward(rows(q, a), kk, vv, rows(out, a), rows(dout, a), lse_rows(lse, a),
                         at::Tensor(), s_->scale, between(s_->window, a, whole));
      rows(dq, a).add_(gq);
      dk.add_(gk);
      dv.add_(gv);
    }
    return {dq.to(q.scalar_type()), scattered(dk, cp).to(k.scalar_type()),
            scattered(dv, cp).to(v.scalar_type()), at::Tensor()};
  }
};

// ---- what the fused kernel does not take: padding masks, dropout, soft caps, `fused` off ------

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
    at::Tensor whole = gathered(t, state->cp);
    ctx->saved_data["state"] = c10::IValue::make_capsule(std::move(state));
    return {whole};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const c10::intrusive_ptr<CpState> state = state_of(ctx);
    const ScopeLoan loan(state->scopes);
    return {scattered(grads[0].contiguous(), state->cp), at::Tensor()};
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

// The unfused path's call for query chunk `a` against key chunk `b` of a sequence of s tokens:
// the call's mask made explicit for the pair (`masked`, the whole sequence's hidden positions,
// when the call has a padding mask), its dropout drawn at the pair's global place.
AttentionCall pair_call(const AttentionCall& call, const CpState& state, const at::Tensor& masked,
                        const CpChunk& a, const CpChunk& b, int64_t s, const at::Tensor& q) {
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
  auto piece = std::make_shared<AttentionPiece>(piece_of(call));
  piece->global_seqlen_q = s;
  piece->global_seqlen_kv = s;
  piece->seqlen_q_offset = a.start;
  piece->seqlen_kv_offset = b.start;
  c.piece = std::move(piece);
  return c;
}

// p2p (`ring`) or all_gather by the unfused path under autograd: every block pair replays the
// call's one dropout draw (the stream then advances by one, as one process's single call).
at::Tensor unfused_blocks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionCall& call, const c10::intrusive_ptr<CpState>& state,
                          bool ring) {
  const ContextParallel& cp = state->cp;
  const int64_t n = cp.size(), r = cp.rank(), s = q.size(1) * n;
  const auto mine = cp_chunks(s, n, r, cp.load_balanced());
  // Each step's keys: (its K, its V, the chunks they hold).
  std::vector<std::tuple<at::Tensor, at::Tensor, std::vector<CpChunk>>> steps;
  if (ring) {
    const variable_list blocks = RingBlocks::apply(packed(k, v), state);
    for (int64_t i = 0; i < n; ++i) {
      const auto [kk, vv] = unpacked(blocks[static_cast<std::size_t>(i)], k, v);
      steps.emplace_back(kk, vv, cp_chunks(s, n, (r - i + n) % n, cp.load_balanced()));
    }
  } else {
    steps.emplace_back(GatheredTokens::apply(k, state)[0], GatheredTokens::apply(v, state)[0],
                       std::vector<CpChunk>{{0, s, 0}});
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
                                          pair_call(call, *state, masked, a, b, s, q), true));
      }
    }
    outs.push_back(merged_rows(parts, rows(q, a), v.size(3)));
  }
  if (draws) set_rng_state({before.seed, before.calls + 1});
  return outs.size() == 1 ? outs[0] : at::cat(outs, 1);
}

c10::intrusive_ptr<CpState> state_for(const at::Tensor& q, const AttentionCall& call,
                                      const ContextParallel& cp) {
  const int64_t s = q.size(1) * cp.size();
  return c10::make_intrusive<CpState>(cp, call.scale, key_window(call, s, s));
}

}  // namespace

std::vector<Placement> over_cp(const ContextParallel& cp, Placement p) {
  std::vector<Placement> out(static_cast<std::size_t>(cp.mesh().ndim()), Replicate{});
  out[static_cast<std::size_t>(cp.mesh_dim())] = p;
  return out;
}

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionCall& call, const ContextParallel& cp) {
  if (!flash_attention_takes(q, k, v, call)) {
    return unfused_blocks(q, k, v, call, state_for(q, call, cp), /*ring=*/true);
  }
  return Ring::apply(q, k, v, state_for(q, call, cp))[0];
}

at::Tensor gathered_kv_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const AttentionCall& call, const ContextParallel& cp) {
  if (!flash_attention_takes(q, k, v, call)) {
    return unfused_blocks(q, k, v, call, state_for(q, call, cp), /*ring=*/false);
  }
  return GatheredKv::apply(q, k, v, state_for(q, call, cp))[0];
}

}  // namespace te::nn::functional::detail
