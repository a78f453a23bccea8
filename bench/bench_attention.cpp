// DotProductAttention's variants, forward + backward on one process, each against the same math
// written in plain LibTorch ops (TE's unfused formula: logits, bias, mask, softmax, a zeroed row
// where no key is visible, times v), alternated call by call; ratio_vs_plain_libtorch = te / plain
// (medians; the bar: <= 1.05). BM_PackedVsPadded: the same batch, half of it padding,
// as packed sequences (qkv_format thd with cu_seqlens) against the padded bshd call with its
// padding mask, both te; ratio_vs_padded_bshd = thd / bshd (the bar: <= 1 / 1.6 = 0.625).
//   bench_attention [--benchmark_filter=...]
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "alternate.h"
#include "te/nn.h"

namespace {

using te::nn::AttentionArgs;
using te::nn::DotProductAttention;
using te::nn::DotProductAttentionOptions;

constexpr int64_t kBatch = 8, kSeq = 256, kHeads = 8, kDim = 64;

using Attend = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;

// Seconds of one forward + backward of `attend` on fresh leaves of q, k, v.
std::function<double()> timed(const Attend& attend, const at::Tensor& q0, const at::Tensor& k0,
                              const at::Tensor& v0) {
  return [=] {
    const at::Tensor q = q0.detach().requires_grad_(true), k = k0.detach().requires_grad_(true),
                     v = v0.detach().requires_grad_(true);
    const auto start = std::chrono::steady_clock::now();
    const at::Tensor y = attend(q, k, v);
    y.backward(at::ones_like(y));
    benchmark::DoNotOptimize(q.grad().data_ptr());
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
}

// Plain LibTorch: softmax(q k^T * scale + bias, hidden keys removed) v, rows with no visible key
// zero; `sink` appends one logit per head to each row's softmax (and drops it after).
at::Tensor plain_attention(const at::Tensor& q, at::Tensor k, at::Tensor v,
                           const at::Tensor& hidden, const at::Tensor& bias,
                           const at::Tensor& sink) {
  if (k.size(2) != q.size(2)) {
    k = k.repeat_interleave(q.size(2) / k.size(2), 2);
    v = v.repeat_interleave(q.size(2) / v.size(2), 2);
  }
  at::Tensor logits = at::matmul(q.transpose(1, 2), k.permute({0, 2, 3, 1})) /
                      std::sqrt(static_cast<double>(q.size(3)));
  if (bias.defined()) logits = logits + bias;
  if (hidden.defined()) logits = logits.masked_fill(hidden, -1e10);
  const int64_t sk = k.size(1);
  if (sink.defined()) {
    logits = at::cat(
        {logits, sink.view({1, -1, 1, 1}).expand({logits.size(0), -1, logits.size(2), 1})}, -1);
  }
  at::Tensor probs = at::softmax(logits, -1);
  if (sink.defined()) probs = probs.narrow(-1, 0, sk);
  if (hidden.defined()) probs = probs.masked_fill(hidden.all(-1, true), 0);
  return at::matmul(probs, v.transpose(1, 2)).transpose(1, 2);
}

// [1, 1, s, s] true above the diagonal (and, with a window, left of it).
at::Tensor causal_hidden(int64_t s, int64_t left) {
  const at::Tensor i = at::arange(s).view({s, 1}), j = at::arange(s).view({1, s});
  at::Tensor hidden = j.gt(i);
  if (left >= 0) hidden = hidden.logical_or(j.lt(i - left));
  return hidden.view({1, 1, s, s});
}

// The padding mask of sequences of `lengths` in [b, 1, s, s].
at::Tensor padding_hidden(const std::vector<int64_t>& lengths, int64_t s) {
  const at::Tensor len = at::tensor(lengths).view({-1, 1, 1, 1});
  return at::arange(s)
      .view({1, 1, 1, s})
      .ge(len)
      .logical_or(at::arange(s).view({1, 1, s, 1}).ge(len));
}

std::vector<int64_t> half_padded_lengths() {
  // Lengths from s/8 to 7s/8: half the padded batch is padding.
  std::vector<int64_t> lengths;
  for (int64_t i = 0; i < kBatch; ++i)
    lengths.push_back(kSeq / 8 + i * (kSeq * 3 / 4) / (kBatch - 1));
  return lengths;
}

void compare(benchmark::State& state, const Attend& te_attend, const Attend& plain,
             int64_t kv_heads) {
  at::manual_seed(0);
  const at::Tensor q = at::randn({kBatch, kSeq, kHeads, kDim}),
                   k = at::randn({kBatch, kSeq, kv_heads, kDim}),
                   v = at::randn({kBatch, kSeq, kv_heads, kDim});
  te::bench::alternate(state, timed(te_attend, q, k, v), timed(plain, q, k, v), "plain_libtorch");
}

void BM_Causal(benchmark::State& state) {
  DotProductAttention dpa(DotProductAttentionOptions(kHeads, kDim).attn_mask_type("causal"));
  const at::Tensor hidden = causal_hidden(kSeq, -1);
  compare(
      state, [&](auto& q, auto& k, auto& v) { return dpa(q, k, v); },
      [&](auto& q, auto& k, auto& v) { return plain_attention(q, k, v, hidden, {}, {}); }, kHeads);
}

void BM_Padding(benchmark::State& state) {
  DotProductAttention dpa(DotProductAttentionOptions(kHeads, kDim).attn_mask_type("padding"));
  const at::Tensor mask = padding_hidden(half_padded_lengths(), kSeq);
  compare(
      state, [&](auto& q, auto& k, auto& v) { return dpa(q, k, v, mask); },
      [&](auto& q, auto& k, auto& v) { return plain_attention(q, k, v, mask, {}, {}); }, kHeads);
}

void BM_SlidingWindow(benchmark::State& state) {
  DotProductAttention dpa(DotProductAttentionOptions(kHeads, kDim)
                              .attn_mask_type("causal")
                              .window_size(te::nn::WindowSize{32, 0}));
  const at::Tensor hidden = causal_hidden(kSeq, 32);
  compare(
      state, [&](auto& q, auto& k, auto& v) { return dpa(q, k, v); },
      [&](auto& q, auto& k, auto& v) { return plain_attention(q, k, v, hidden, {}, {}); }, kHeads);
}

void BM_Alibi(benchmark::State& state) {
  DotProductAttention dpa(DotProductAttentionOptions(kHeads, kDim).attn_mask_type("causal"));
  const at::Tensor hidden = causal_hidden(kSeq, -1);
  // TE's ALiBi bias for the causal (top-left) diagonal, -slope * |i - j|, built per call as a
  // model does (BLOOM's build_alibi_tensor runs in every forward).
  const at::Tensor slopes = te::nn::functional::alibi_slopes(kHeads).view({1, kHeads, 1, 1});
  const AttentionArgs args = AttentionArgs().core_attention_bias_type("alibi");
  compare(
      state, [&](auto& q, auto& k, auto& v) { return dpa(q, k, v, {}, args); },
      [&](auto& q, auto& k, auto& v) {
        const at::Tensor distance =
            (at::arange(kSeq).view({kSeq, 1}) - at::arange(kSeq).view({1, kSeq})).abs();
        return plain_attention(q, k, v, hidden, -slopes * distance, {});
      },
      kHeads);
}

void BM_Gqa(benchmark::State& state) {
  DotProductAttention dpa(
      DotProductAttentionOptions(kHeads, kDim).attn_mask_type("causal").num_gqa_groups(2));
  const at::Tensor hidden = causal_hidden(kSeq, -1);
  compare(
      state, [&](auto& q, auto& k, auto& v) { return dpa(q, k, v); },
      [&](auto& q, auto& k, auto& v) { return plain_attention(q, k, v, hidden, {}, {}); }, 2);
}

void BM_LearnableSink(benchmark::State& state) {
  DotProductAttention dpa(
      DotProductAttentionOptions(kHeads, kDim).attn_mask_type("causal").softmax_type("learnable"));
  const at::Tensor hidden = causal_hidden(kSeq, -1);
  const at::Tensor sink = dpa->softmax_offset;
  compare(
      state, [&](auto& q, auto& k, auto& v) { return dpa(q, k, v); },
      [&](auto& q, auto& k, auto& v) { return plain_attention(q, k, v, hidden, {}, sink); },
      kHeads);
}

// The same sequences, half of the padded batch padding: packed (thd) against padded (bshd).
void BM_PackedVsPadded(benchmark::State& state) {
  const std::string type = state.range(0) ? "padding_causal" : "padding";
  const std::vector<int64_t> lengths = half_padded_lengths();
  std::vector<int32_t> cu = {0};
  for (const int64_t l : lengths) cu.push_back(cu.back() + static_cast<int32_t>(l));
  at::manual_seed(0);
  const at::Tensor q = at::randn({kBatch, kSeq, kHeads, kDim}),
                   k = at::randn({kBatch, kSeq, kHeads, kDim}),
                   v = at::randn({kBatch, kSeq, kHeads, kDim});
  auto pack = [&](const at::Tensor& t) {
    std::vector<at::Tensor> rows;
    for (int64_t i = 0; i < kBatch; ++i) rows.push_back(t[i].narrow(0, 0, lengths[i]));
    return at::cat(rows);
  };
  DotProductAttention padded(DotProductAttentionOptions(kHeads, kDim).attn_mask_type(type));
  DotProductAttention packed(
      DotProductAttentionOptions(kHeads, kDim).attn_mask_type(type).qkv_format("thd"));
  const at::Tensor mask = padding_hidden(lengths, kSeq);
  const AttentionArgs args =
      AttentionArgs().cu_seqlens_q(at::tensor(cu)).cu_seqlens_kv(at::tensor(cu));
  te::bench::alternate(
      state,
      timed([&](auto& q, auto& k, auto& v) { return packed(q, k, v, {}, args); }, pack(q), pack(k),
            pack(v)),
      timed([&](auto& q, auto& k, auto& v) { return padded(q, k, v, mask); }, q, k, v),
      "padded_bshd");
  state.counters["padding_fraction"] =
      1.0 - static_cast<double>(cu.back()) / static_cast<double>(kBatch * kSeq);
}

BENCHMARK(BM_Causal)->Iterations(11)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Padding)->Iterations(11)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SlidingWindow)->Iterations(11)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Alibi)->Iterations(11)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gqa)->Iterations(11)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LearnableSink)->Iterations(11)->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PackedVsPadded)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("causal")
    ->Iterations(11)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) { return te::bench::run_benchmarks(argc, argv); }
