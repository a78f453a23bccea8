// parallel_cross_entropy: one process against LibTorch's own cross_entropy (smoothing, ignored
// tokens, mean or per token), and vocabulary-sharded logits on every layout against one process,
// without gathering the logits.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>

#include <mutex>

#include "../distributed/dist_test_util.h"
#include "../expect_error.h"
#include "te/nn.h"

namespace te::nn {
namespace {

using functional::CrossEntropyOptions;
using functional::parallel_cross_entropy;
using test::piece_of;

constexpr int64_t kBatch = 4, kSeq = 5;

at::Tensor logits_of(int64_t vocab) {
  return (test::seeded_integers({kBatch, kSeq, vocab}, 7) / 3).to(at::kFloat);
}

// Targets covering the vocabulary, two of them ignored (-100).
at::Tensor targets_of(int64_t vocab) {
  at::Tensor t = at::remainder(at::arange(kBatch * kSeq, at::kLong) * 5 + 1, vocab);
  t[3] = -100;
  t[11] = -100;
  return t.view({kBatch, kSeq});
}

struct Reference {
  at::Tensor loss, grad;
};

Reference torch_reference(const at::Tensor& logits, const at::Tensor& target,
                          const CrossEntropyOptions& o) {
  const at::Tensor x = logits.detach().clone().requires_grad_(true);
  namespace F = torch::nn::functional;
  auto fo = F::CrossEntropyFuncOptions().ignore_index(o.ignore_idx).label_smoothing(
      o.label_smoothing);
  if (o.reduce_loss) {
    fo.reduction(torch::kMean);
  } else {
    fo.reduction(torch::kNone);
  }
  at::Tensor loss = F::cross_entropy(x.reshape({-1, x.size(-1)}), target.reshape({-1}), fo);
  if (!o.reduce_loss) loss = loss.view(target.sizes());
  (loss * (o.reduce_loss ? at::ones({}) : at::arange(loss.numel()).view(loss.sizes()) % 3 + 1))
      .sum()
      .backward();
  return {loss.detach(), x.grad()};
}

CrossEntropyOptions options(double ls, bool reduce) {
  CrossEntropyOptions o;
  o.label_smoothing = ls;
  o.reduce_loss = reduce;
  return o;
}

TEST(ParallelCrossEntropy, EqualsLibTorchsCrossEntropyOnOneProcess) {
  for (double ls : {0.0, 0.1}) {
    for (bool reduce : {false, true}) {
      const CrossEntropyOptions o = options(ls, reduce);
      const at::Tensor logits = logits_of(13);
      const at::Tensor target = targets_of(13);
      const Reference ref = torch_reference(logits, target, o);
      const at::Tensor x = logits.clone().requires_grad_(true);
      const at::Tensor loss = parallel_cross_entropy(x, target, o);
      EXPECT_EQ(loss.scalar_type(), at::kFloat);
      EXPECT_TRUE(at::allclose(loss, ref.loss, 1e-5, 1e-6)) << ls << " " << reduce;
      (loss * (reduce ? at::ones({}) : at::arange(loss.numel()).view(loss.sizes()) % 3 + 1))
          .sum()
          .backward();
      EXPECT_TRUE(at::allclose(x.grad(), ref.grad, 1e-5, 1e-6)) << ls << " " << reduce;
      // Ignored tokens: no loss, no gradient.
      if (!reduce) EXPECT_EQ(loss.view(-1)[3].item<float>(), 0.0f);
      EXPECT_EQ(x.grad().view({-1, 13})[3].abs().sum().item<float>(), 0.0f);
    }
  }
  // bf16 logits: computed and returned in fp32.
  EXPECT_EQ(parallel_cross_entropy(logits_of(13).to(at::kBFloat16), targets_of(13)).scalar_type(),
            at::kFloat);
}

TEST(ParallelCrossEntropy, RefusesBadTargetsNamingThem) {
  at::Tensor target = targets_of(13);
  target[1][2] = 13;
  EXPECT_ERROR(parallel_cross_entropy(logits_of(13), target),
               "target 13 (element 7) is outside the vocabulary [0, 13) and is not ignore_idx "
               "(-100)");
  EXPECT_ERROR(parallel_cross_entropy(logits_of(13), targets_of(13).to(at::kFloat)),
               "targets are Float; give integer token ids");
  EXPECT_ERROR(parallel_cross_entropy(logits_of(13), targets_of(13).narrow(1, 0, 2)),
               "disagree; give logits [..., vocab] for targets [...]");
  EXPECT_ERROR(parallel_cross_entropy(logits_of(13), targets_of(13), options(1.5, false)),
               "label_smoothing 1.5 is not in [0, 1]");
}

struct Layout {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<std::string> axes;
  std::vector<Placement> logits;  // of [batch, seq, vocab]
  int64_t vocab = 16;
};

void PrintTo(const Layout& l, std::ostream* os) { *os << l.name; }

class CrossEntropyLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(CrossEntropyLayouts, EqualOneProcessWithoutGatheringTheLogits) {
  const Layout& l = GetParam();
  int64_t world = 1;
  for (int64_t s : l.shape) world *= s;
  for (double ls : {0.0, 0.1}) {
    for (bool reduce : {false, true}) {
      const CrossEntropyOptions o = options(ls, reduce);
      const at::Tensor logits = logits_of(l.vocab);
      const at::Tensor target = targets_of(l.vocab);
      const Reference ref = torch_reference(logits, target, o);
      std::mutex mutex;
      run_local_ranks(static_cast<int>(world), [&](int rank) {
        DeviceMesh mesh(l.shape, l.axes);
        std::vector<Placement> tokens = l.logits;
        for (Placement& p : tokens) {
          if (const auto* s = std::get_if<Shard>(&p); s != nullptr && s->dim == 2) p = Replicate{};
        }
        const at::Tensor x_local = piece_of(logits, mesh, l.logits, rank).requires_grad_(true);
        const DTensor x = DTensor::from_local(x_local, mesh, l.logits, logits.sizes().vec());
        const DTensor t = DTensor::from_local(piece_of(target, mesh, tokens, rank), mesh, tokens,
                                              target.sizes().vec());
        CommTrace trace;
        const DTensor loss = parallel_cross_entropy(x, t, o);
        EXPECT_EQ(trace.count(Collective::kAllGather), 0) << trace.table();
        const at::Tensor full = loss.full_tensor();
        const at::Tensor weight =
            reduce ? at::ones({}) : at::arange(full.numel()).view(full.sizes()) % 3 + 1;
        (full * weight).sum().backward();
        std::lock_guard<std::mutex> lock(mutex);
        EXPECT_TRUE(at::allclose(full, ref.loss, 1e-5, 1e-6))
            << "rank " << rank << " ls " << ls << " reduce " << reduce;
        EXPECT_TRUE(at::allclose(x_local.grad(), piece_of(ref.grad, mesh, l.logits, rank), 1e-5,
                                 1e-6))
            << "rank " << rank << " ls " << ls << " reduce " << reduce;
      });
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, CrossEntropyLayouts,
    ::testing::Values(Layout{"TP2Vocab", {2}, {"tp"}, {Shard{2}}},
                      Layout{"TP2VocabUneven", {2}, {"tp"}, {Shard{2}}, 17},
                      Layout{"DP2", {2}, {"data"}, {Shard{0}}},
                      Layout{"DP2xTP2Vocab", {2, 2}, {"data", "tp"}, {Shard{0}, Shard{2}}},
                      Layout{"TP4VocabAndSequence", {2, 2}, {"sp", "tp"}, {Shard{1}, Shard{2}}}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace te::nn
