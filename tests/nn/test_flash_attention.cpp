// te's fused CPU attention (modules/src/flash_attention.cpp) against the unfused path on the same
// inputs: the output and the gradients of q, k and v on every window it takes (causal, bottom-right
// with fewer and with more queries than keys, sliding windows, GQA, lengths that are not a
// multiple of its blocks), in float32, bfloat16 and float16; its log-sum-exp and that gradient
// against logsumexp of the masked logits; NaN kept; which calls it takes.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "../../modules/src/flash_attention.h"
#include "nn_test_util.h"
#include "te/nn.h"

namespace te::nn {
namespace {

namespace F = functional;
using test::Close;
using test::leaf;
using test::randn;

struct Case {
  std::string name, type;
  int64_t sq, sk, heads, kv_heads;
  std::optional<std::pair<int64_t, int64_t>> window;
};

std::vector<Case> cases() {
  return {{"no_mask", "no_mask", 70, 70, 4, 4, std::nullopt},
          {"causal", "causal", 130, 130, 4, 4, std::nullopt},
          {"causal_gqa", "causal", 96, 96, 6, 2, std::nullopt},
          {"mqa", "causal", 65, 65, 3, 1, std::nullopt},
          {"bottom_right_more_keys", "causal_bottom_right", 70, 150, 4, 2, std::nullopt},
          {"bottom_right_dead_rows", "causal_bottom_right", 150, 70, 2, 2, std::nullopt},
          {"causal_window", "causal", 200, 200, 2, 1, std::make_pair<int64_t, int64_t>(30, 0)},
          {"two_sided_window", "no_mask", 140, 140, 2, 2, std::make_pair<int64_t, int64_t>(20, 5)},
          {"cross_no_mask", "no_mask", 33, 129, 2, 1, std::nullopt},
          {"one_row", "causal", 1, 1, 2, 2, std::nullopt}};
}

F::AttentionCall call_for(const Case& c, bool fused) {
  F::AttentionCall call;
  call.spec = F::mask_spec(c.type, c.window);
  call.scale = 0.125;
  call.fused = fused;
  return call;
}

struct Result {
  at::Tensor out, dq, dk, dv;
};

Result run(const at::Tensor& q0, const at::Tensor& k0, const at::Tensor& v0, const at::Tensor& dy,
           const F::AttentionCall& call) {
  const at::Tensor q = leaf(q0), k = leaf(k0), v = leaf(v0);
  const at::Tensor out = F::attention(q, k, v, call);
  out.backward(dy.to(out.scalar_type()));
  return {out.detach().to(at::kFloat), q.grad().to(at::kFloat), k.grad().to(at::kFloat),
          v.grad().to(at::kFloat)};
}

struct Inputs {
  at::Tensor q, k, v, dy;
};
Inputs inputs(const Case& c, uint64_t seed) {
  const int64_t b = 2, d = 64;
  return {randn({b, c.sq, c.heads, d}, seed), randn({b, c.sk, c.kv_heads, d}, seed + 1),
          randn({b, c.sk, c.kv_heads, d}, seed + 2), randn({b, c.sq, c.heads, d}, seed + 3)};
}

TEST(FlashAttention, MatchesTheUnfusedPathOnEveryWindowItTakes) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = inputs(c, 11);
    const F::AttentionCall fused = call_for(c, true), unfused = call_for(c, false);
    EXPECT_EQ(F::attention_plan(in.q, in.k, in.v, fused).backend, "te_flash_cpu");
    EXPECT_EQ(F::attention_plan(in.q, in.k, in.v, unfused).backend, "unfused");
    const Result a = run(in.q, in.k, in.v, in.dy, fused), b = run(in.q, in.k, in.v, in.dy, unfused);
    EXPECT_TRUE(Close(a.out, b.out, 2e-6)) << "out";
    EXPECT_TRUE(Close(a.dq, b.dq, 2e-6)) << "dq";
    EXPECT_TRUE(Close(a.dk, b.dk, 2e-6)) << "dk";
    EXPECT_TRUE(Close(a.dv, b.dv, 2e-6)) << "dv";
  }
}

// Half precisions widen once and accumulate in float32: the result is the float32 path's on the
// same (rounded) inputs, rounded once.
TEST(FlashAttention, HalfPrecisionsAreTheFloatResultRounded) {
  for (const at::ScalarType type : {at::kBFloat16, at::kHalf}) {
    for (const Case& c : cases()) {
      SCOPED_TRACE(c.name + (type == at::kHalf ? " fp16" : " bf16"));
      const Inputs in = inputs(c, 23);
      const at::Tensor q = in.q.to(type), k = in.k.to(type), v = in.v.to(type);
      const at::Tensor dy = in.dy.to(type);
      const Result a = run(q, k, v, dy, call_for(c, true));
      const Result ref = run(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat),
                             dy.to(at::kFloat), call_for(c, true));
      const double tol = type == at::kHalf ? 1e-3 : 8e-3;  // one rounding of each result
      EXPECT_TRUE(Close(a.out, ref.out.to(type).to(at::kFloat), tol)) << "out";
      EXPECT_TRUE(Close(a.dq, ref.dq, tol)) << "dq";
      EXPECT_TRUE(Close(a.dk, ref.dk, tol)) << "dk";
      EXPECT_TRUE(Close(a.dv, ref.dv, tol)) << "dv";
    }
  }
}

// The log-sum-exp of each row's visible scaled logits (-inf where none is visible), and its
// gradient: what merging partial results by their log-sum-exp needs.
TEST(FlashAttention, LogSumExpAndItsGradientAreLogsumexps) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Inputs in = inputs(c, 31);
    const F::AttentionCall call = call_for(c, true);
    const auto window = F::detail::key_window(call, c.sq, c.sk);
    const at::Tensor q = leaf(in.q), k = leaf(in.k), v = leaf(in.v);
    const auto [out, lse] = F::detail::flash_attention(q, k, v, call.scale, window);
    const at::Tensor hidden =
        F::masked_positions({}, call.spec, c.sq, c.sk, at::TensorOptions().dtype(at::kFloat));
    const at::Tensor rq = leaf(in.q), rk = leaf(in.k), rv = leaf(in.v);
    const int64_t rep = c.heads / c.kv_heads;
    at::Tensor logits = at::einsum("bqhd,bkhd->bhqk", {rq, rk.repeat_interleave(rep, 2)}) * 0.125;
    if (hidden.defined()) {
      logits = logits.masked_fill(hidden, -std::numeric_limits<float>::infinity());
    }
    const at::Tensor ref = at::logsumexp(logits, -1);
    EXPECT_TRUE(at::equal(lse.isinf(), ref.isinf()));
    const at::Tensor seen = ref.isfinite();
    EXPECT_TRUE(Close(lse.masked_select(seen), ref.masked_select(seen), 2e-6));
    // A gradient through the log-sum-exp alone (dead rows weigh nothing).
    const at::Tensor w = randn(ref.sizes().vec(), 5).masked_fill(seen.logical_not(), 0);
    (lse.masked_fill(seen.logical_not(), 0) * w).sum().backward();
    (ref.masked_fill(seen.logical_not(), 0) * w).sum().backward();
    EXPECT_TRUE(Close(q.grad(), rq.grad(), 2e-6)) << "dq";
    EXPECT_TRUE(Close(k.grad(), rk.grad(), 2e-6)) << "dk";
    EXPECT_FALSE(v.grad().defined() && v.grad().abs().max().item<double>() > 0) << "dv";
    (void)out;
  }
}

TEST(FlashAttention, ANanLogitMakesItsRowNan) {
  const Case c = cases()[1];
  Inputs in = inputs(c, 41);
  in.q[0][100][1][3] = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor out = F::attention(in.q, in.k, in.v, call_for(c, true));
  EXPECT_TRUE(out[0][100][1].isnan().all().item<bool>());
  EXPECT_EQ(out.isnan().sum().item<int64_t>(), out.size(3));  // that row alone
}

// What it leaves to the unfused path: dropout in training, biases, sinks, soft caps, mask tensors,
// float64, `fused` off; and the meta tensors of a plan run it as shapes only.
TEST(FlashAttention, TakesOnlyWhatItComputes) {
  const at::Tensor q = randn({1, 8, 2, 16}, 1), k = randn({1, 8, 2, 16}, 2);
  const auto backend = [&](const F::AttentionCall& call, const at::Tensor& x) {
    return F::attention_plan(x, x, x, call).backend;
  };
  F::AttentionCall plain;
  plain.spec = F::mask_spec("causal");
  EXPECT_EQ(backend(plain, q), "te_flash_cpu");
  F::AttentionCall dropout = plain;
  dropout.dropout = 0.1;
  EXPECT_EQ(backend(dropout, q), "te_flash_cpu");  // not training: no dropout
  dropout.training = true;
  EXPECT_NE(backend(dropout, q), "te_flash_cpu");
  F::AttentionCall alibi = plain;
  alibi.bias_type = AttnBiasType::kAlibi;
  EXPECT_NE(backend(alibi, q), "te_flash_cpu");
  F::AttentionCall sink = plain;
  sink.softmax_type = SoftmaxType::kOffByOne;
  EXPECT_NE(backend(sink, q), "te_flash_cpu");
  F::AttentionCall cap = plain;
  cap.softcap = 30;
  EXPECT_NE(backend(cap, q), "te_flash_cpu");
  F::AttentionCall padded;
  padded.spec = F::mask_spec("padding_causal");
  padded.mask = at::zeros({1, 1, 8, 8}, at::kBool);
  EXPECT_NE(backend(padded, q), "te_flash_cpu");
  EXPECT_NE(backend(plain, q.to(at::kDouble)), "te_flash_cpu");
  const at::Tensor m = leaf(at::empty({1, 8, 2, 16}, at::TensorOptions().device(at::kMeta)));
  EXPECT_EQ(backend(plain, m), "te_flash_cpu");
  const at::Tensor out = F::attention(m, m, m, plain);
  out.sum().backward();
  EXPECT_TRUE(out.is_meta());
  EXPECT_EQ(m.grad().sizes(), m.sizes());
  (void)k;
}

}  // namespace
}  // namespace te::nn
