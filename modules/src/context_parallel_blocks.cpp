// The block-wise context parallel strategies, "p2p" and "all_gather" (context_parallel.cpp says
// how they relate to TE's), on te's fused CPU kernel's forward and backward primitives
// (flash_attention.h); for what that kernel does not take (a padding mask, dropout in training,
// a soft cap, `fused` off), the same blocks on the unfused path (context_parallel_unfused.cpp).

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

// The forward's output from each query chunk's (out, lse), saved for backward with q, k, v; rows
// no chunk holds (a packed sequence's padding) are zeros.
variable_list saved_result(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                           const at::Tensor& v, const std::vector<CpChunk>& mine,
                           const std::vector<std::pair<at::Tensor, at::Tensor>>& chunks,
                           c10::intrusive_ptr<CpState> state) {
  const at::TensorOptions f32 = q.options().dtype(at::kFloat);
  at::Tensor out = at::zeros({q.size(0), q.size(1), q.size(2), v.size(3)}, f32);
  at::Tensor lse =
      at::full({q.size(0), q.size(2), q.size(1)}, -std::numeric_limits<float>::infinity(), f32);
  for (std::size_t a = 0; a < mine.size(); ++a) {
    rows(out, mine[a]).copy_(chunks[a].first);
    lse_rows(lse, mine[a]).copy_(chunks[a].second);
  }
  out = out.to(q.scalar_type());
  ctx->save_for_backward({q, k, v, out, lse});
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

// Block pair (a, b)'s share of the gradients (over every key the rows of `a` see: x.out and x.lse
// are the merged ones), added to dq's rows of a and dk's and dv's rows of b.
void add_pair_grads(const Saved& x, const at::Tensor& kk, const at::Tensor& vv, const CpChunk& a,
                    const CpChunk& b, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv) {
  const CpState& s = *x.state;
  auto [gq, gk, gv] =
      flash_backward(rows(x.q, a), rows(kk, b), rows(vv, b), rows(x.out, a), rows(x.dout, a),
                     lse_rows(x.lse, a), at::Tensor(), s.scale, between(s.window, a, b));
  rows(dq, a).add_(gq);
  rows(dk, b).add_(gk);
  rows(dv, b).add_(gv);
}

// ---- p2p --------------------------------------------------------------------------------------

struct Ring : public torch::autograd::Function<Ring> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, c10::intrusive_ptr<CpState> state) {
    const ContextParallel& cp = state->cp;
    const int64_t n = cp.size(), r = cp.rank();
    const auto mine = state->layout.chunks(r);
    std::vector<std::vector<std::pair<at::Tensor, at::Tensor>>> parts(mine.size());
    at::Tensor kv = packed(k, v);
    for (int64_t i = 0; i < n; ++i) {
      InFlight next = i + 1 < n ? InFlight(cp, kv) : InFlight();
      const auto [kk, vv] = unpacked(kv, k, v);
      const auto theirs = state->layout.chunks((r - i + n) % n);
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
    return saved_result(ctx, q, k, v, mine, chunks, std::move(state));
  }

  // K/V pass round the ring again; the running sum of a block's dK/dV travels one hop behind
  // it and reaches the block's owner after the last step.
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Saved x = saved_of(ctx, grads);
    const ScopeLoan loan(x.state->scopes);
    const CpState* s_ = x.state.get();
    const ContextParallel& cp = s_->cp;
    const at::Tensor &q = x.q, &k = x.k, &v = x.v;
    const int64_t n = cp.size(), r = cp.rank();
    const auto mine = s_->layout.chunks(r);
    at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    const at::TensorOptions f32 = k.options().dtype(at::kFloat);
    at::Tensor kv = packed(k, v), running;
    for (int64_t i = 0; i < n; ++i) {
      InFlight next = i + 1 < n ? InFlight(cp, kv) : InFlight();
      const auto [kk, vv] = unpacked(kv, k, v);
      at::Tensor dk = at::zeros(k.sizes(), f32), dv = at::zeros(v.sizes(), f32);
      const auto theirs = s_->layout.chunks((r - i + n) % n);
      for (const CpChunk& a : mine) {
        for (const CpChunk& b : theirs) {
          if (sees(s_->window, a, b)) add_pair_grads(x, kk, vv, a, b, dq, dk, dv);
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

struct GatheredKv : public torch::autograd::Function<GatheredKv> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, c10::intrusive_ptr<CpState> state) {
    const at::Tensor kk = gathered(k, *state), vv = gathered(v, *state);
    const auto mine = state->layout.chunks(state->cp.rank());
    std::vector<std::pair<at::Tensor, at::Tensor>> chunks;
    for (const CpChunk& a : mine) {
      std::vector<std::pair<at::Tensor, at::Tensor>> parts;  // (its sequence's keys, whole)
      for (const CpChunk& b : state->layout.sequences()) {
        if (!sees(state->window, a, b)) continue;
        parts.push_back(flash_forward(rows(q, a), rows(kk, b), rows(vv, b), state->scale,
                                      between(state->window, a, b)));
      }
      chunks.push_back(merged(parts, rows(q, a), v.size(3)));
    }
    return saved_result(ctx, q, k, v, mine, chunks, std::move(state));  // K/V gathered again
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const Saved x = saved_of(ctx, grads);
    const ScopeLoan loan(x.state->scopes);
    const CpState* s_ = x.state.get();
    const at::Tensor &q = x.q, &k = x.k, &v = x.v;
    const at::Tensor kk = gathered(k, *s_), vv = gathered(v, *s_);
    at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    at::Tensor dk = at::zeros(kk.sizes(), dq.options()), dv = at::zeros(vv.sizes(), dq.options());
    for (const CpChunk& a : s_->layout.chunks(s_->cp.rank())) {
      for (const CpChunk& b : s_->layout.sequences()) {
        if (sees(s_->window, a, b)) add_pair_grads(x, kk, vv, a, b, dq, dk, dv);
      }
    }
    return {dq.to(q.scalar_type()), scattered(dk, *s_).to(k.scalar_type()),
            scattered(dv, *s_).to(v.scalar_type()), at::Tensor()};
  }
};

// The call each sequence makes: packed sequences' padding type means, for one sequence alone,
// its causal part (their padding is in no chunk).
AttentionCall per_sequence(const AttentionCall& call, const CpLayout& layout) {
  if (!layout.packed()) return call;
  AttentionCall c = call;
  c.packed = {};
  c.spec.type = unpadded_type(call.spec.type);
  return c;
}

c10::intrusive_ptr<CpState> state_for(const AttentionCall& call, const ContextParallel& cp,
                                      const CpLayout& layout) {
  // (A packed sequence's queries and keys are as many: its diagonal is at offset 0.)
  const int64_t s = layout.tokens();
  return c10::make_intrusive<CpState>(cp, layout, call.scale, key_window(call, s, s));
}

}  // namespace

c10::intrusive_ptr<CpState> state_of(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<CpState>(ctx->saved_data["state"].toCapsule());
}

// The window query chunk `q` sees key chunk `k` through: the call's, moved by their distance.
KeyWindow between(const KeyWindow& w, const CpChunk& q, const CpChunk& k) {
  return {w.offset + q.start - k.start, w.left, w.right};
}

// Whether some query of chunk `q` sees some key of chunk `k` (of the same sequence).
bool sees(const KeyWindow& w, const CpChunk& q, const CpChunk& k) {
  if (q.sequence != k.sequence) return false;
  const KeyWindow b = between(w, q, k);
  if (b.right >= 0 && b.offset + q.length - 1 + b.right < 0) return false;  // all keys after
  if (b.left >= 0 && k.length - 1 < b.offset - b.left) return false;        // all keys before
  return true;
}

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

// Every rank's tokens of `t` along dim 1, in the sequences' own order.
at::Tensor gathered(const at::Tensor& t, const CpState& state) {
  const ContextParallel& cp = state.cp;
  const at::Tensor ranked = DTensor::from_local(t, cp.mesh(), over_cp(cp, Shard{1}))
                                .redistribute(over_cp(cp, Replicate{}))
                                .to_local();
  return state.layout.sequence_order(ranked);
}

// Whole-sequence gradients summed over the ranks, each rank keeping its own tokens.
at::Tensor scattered(const at::Tensor& whole, const CpState& state) {
  const ContextParallel& cp = state.cp;
  const at::Tensor ranked = state.layout.rank_order(whole);
  return DTensor::from_local(ranked, cp.mesh(), over_cp(cp, Partial{}))
      .redistribute(over_cp(cp, Shard{1}))
      .to_local();
}

std::vector<Placement> over_cp(const ContextParallel& cp, Placement p) {
  std::vector<Placement> out(static_cast<std::size_t>(cp.mesh().ndim()), Replicate{});
  out[static_cast<std::size_t>(cp.mesh_dim())] = p;
  return out;
}

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionCall& call_in, const ContextParallel& cp,
                          const CpLayout& layout) {
  const AttentionCall call = per_sequence(call_in, layout);
  if (!flash_attention_takes(q, k, v, call)) {
    return unfused_blocks(q, k, v, call, state_for(call, cp, layout), /*ring=*/true);
  }
  return Ring::apply(q, k, v, state_for(call, cp, layout))[0];
}

at::Tensor gathered_kv_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const AttentionCall& call_in, const ContextParallel& cp,
                                 const CpLayout& layout) {
  const AttentionCall call = per_sequence(call_in, layout);
  if (!flash_attention_takes(q, k, v, call)) {
    return unfused_blocks(q, k, v, call, state_for(call, cp, layout), /*ring=*/false);
  }
  return GatheredKv::apply(q, k, v, state_for(call, cp, layout))[0];
}

}  // namespace te::nn::functional::detail
