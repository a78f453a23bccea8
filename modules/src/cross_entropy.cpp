// Cross entropy over a vocabulary that may be sharded (TE's parallel_cross_entropy, Megatron's
// vocab_parallel_cross_entropy): one body for one process and for a mesh, where each reduction
// over the vocabulary is a local one followed by a reduction over the ranks that shard it.

#include <ATen/ATen.h>

#include <functional>

#include "te/distributed/dtensor.h"
#include "te/distributed/mesh.h"
#include "te/error.h"
#include "te/nn/functional.h"

namespace te::nn::functional {

namespace {

using Reduce = std::function<at::Tensor(const at::Tensor&)>;

// What the body needs beyond this rank's logits: where its columns sit in the vocabulary, and
// how a per-token partial over them becomes the whole vocabulary's (sum, differentiable; max,
// not: it only steadies the exponentials).
struct VocabShard {
  int64_t offset = 0;
  int64_t vocab = 0;
  Reduce sum;
  Reduce max;
};

void check_inputs(const at::Tensor& logits, const at::Tensor& target, int64_t vocab,
                  const CrossEntropyOptions& options) {
  TE_CHECK(logits.dim() >= 1 && at::isFloatingType(logits.scalar_type()),
           "parallel_cross_entropy: logits are ", logits.scalar_type(), " ", logits.sizes(),
           "; give floating-point logits [..., vocab]");
  TE_CHECK(at::isIntegralType(target.scalar_type(), /*includeBool=*/false),
           "parallel_cross_entropy: targets are ", target.scalar_type(),
           "; give integer token ids");
  TE_CHECK(options.label_smoothing >= 0 && options.label_smoothing <= 1,
           "parallel_cross_entropy: label_smoothing ", options.label_smoothing,
           " is not in [0, 1]");
  if (target.numel() == 0 || target.is_meta()) return;
  const at::Tensor bad = (target != options.ignore_idx) & ((target < 0) | (target >= vocab));
  if (!bad.any().item<bool>()) return;
  const int64_t at = bad.reshape({-1}).nonzero()[0][0].item<int64_t>();
  TE_FAIL("parallel_cross_entropy: target ", target.reshape({-1})[at].item<int64_t>(), " (element ",
          at, ") is outside the vocabulary [0, ", vocab, ") and is not ignore_idx (",
          options.ignore_idx, ")");
}

// Per-token losses (fp32, zero where ignored) from this rank's logits [..., columns].
at::Tensor token_losses(const at::Tensor& logits, const at::Tensor& target, const VocabShard& v,
                        const CrossEntropyOptions& options) {
  const at::Tensor x = logits.to(at::kFloat);
  const int64_t columns = x.size(-1);
  const at::Tensor m = v.max(std::get<0>(x.detach().max(-1)));
  const at::Tensor lse = m + at::log(v.sum((x - m.unsqueeze(-1)).exp().sum(-1)));
  const at::Tensor valid = target != options.ignore_idx;
  const at::Tensor here = valid & (target >= v.offset) & (target < v.offset + columns);
  const at::Tensor index = (target - v.offset).masked_fill(~here, 0).to(at::kLong);
  const at::Tensor picked =
      v.sum(x.gather(-1, index.unsqueeze(-1)).squeeze(-1).masked_fill(~here, 0));
  at::Tensor loss = lse - picked;
  const double ls = options.label_smoothing;
  if (ls > 0) {
    loss = (1 - ls) * loss + ls * (lse - v.sum(x.sum(-1)) / static_cast<double>(v.vocab));
  }
  return loss.masked_fill(~valid, 0);
}

}  // namespace

at::Tensor parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                  const CrossEntropyOptions& options) {
  const int64_t vocab = logits.dim() >= 1 ? logits.size(-1) : 0;
  check_inputs(logits, target, vocab, options);
  TE_CHECK(logits.sizes().slice(0, logits.dim() - 1) == target.sizes(),
           "parallel_cross_entropy: logits ", logits.sizes(), " and targets ", target.sizes(),
           " disagree; give logits [..., vocab] for targets [...]");
  const Reduce same = [](const at::Tensor& t) { return t; };
  const at::Tensor loss = token_losses(logits, target, {0, vocab, same, same}, options);
  if (!options.reduce_loss) return loss;
  return loss.sum() / (target != options.ignore_idx).sum().clamp_min(1);
}

DTensor parallel_cross_entropy(const DTensor& logits_in, const DTensor& target_in,
                               const CrossEntropyOptions& options) {
  const int64_t last = logits_in.dim() - 1;
  const DeviceMesh& mesh = logits_in.mesh();
  const std::size_t n = logits_in.placements().size();
  // Logits: reduced where partial, whole on every dim but the vocabulary's shards and the
  // token dims' shards. Tokens (targets, losses): the logits' token layout.
  std::vector<Placement> use = logits_in.placements(), tokens(n), partial(n);
  std::vector<int64_t> vocab_dims;
  for (std::size_t m = 0; m < n; ++m) {
    if (is_partial(use[m])) use[m] = Replicate{};
    const auto* s = std::get_if<Shard>(&use[m]);
    if (s != nullptr && s->dim == last) {
      vocab_dims.push_back(static_cast<int64_t>(m));
      tokens[m] = Replicate{};
      partial[m] = Partial{};
    } else {
      tokens[m] = partial[m] = use[m];
    }
  }
  const DTensor logits = logits_in.redistribute(use);
  const DTensor target = target_in.redistribute(tokens);
  check_inputs(logits.to_local(), target.to_local(), logits.size(last), options);
  TE_CHECK(std::vector<int64_t>(logits.sizes().begin(), logits.sizes().end() - 1) == target.sizes(),
           "parallel_cross_entropy: logits ", logits.to_string(), " and targets ",
           target.to_string(), " disagree; give logits [..., vocab] for targets [...]");
  const std::vector<int64_t> token_shape = target.sizes();
  VocabShard v;
  v.offset =
      local_chunks(logits.sizes(), mesh, use, mesh.rank())[static_cast<std::size_t>(last)].offset;
  v.vocab = logits.size(last);
  v.sum = [&](const at::Tensor& t) {
    return DTensor::from_local(t, mesh, partial, token_shape).redistribute(tokens).to_local();
  };
  v.max = [&](const at::Tensor& t) {
    return vocab_dims.empty() ? t : mesh.all_reduce(t, ReduceOp::kMax, vocab_dims);
  };
  const DTensor loss = DTensor::from_local(
      token_losses(logits.to_local(), target.to_local(), v, options), mesh, tokens, token_shape);
  if (!options.reduce_loss) return loss;
  // The mean over every rank's tokens: sums over the ranks that split them.
  std::vector<Placement> sums(n, Replicate{});
  for (std::size_t m = 0; m < n; ++m) {
    if (is_shard(tokens[m])) sums[m] = Partial{};
  }
  const std::vector<Placement> whole(n, Replicate{});
  const at::Tensor total =
      DTensor::from_local(loss.to_local().sum(), mesh, sums, std::vector<int64_t>{})
          .redistribute(whole)
          .to_local();
  const at::Tensor count =
      DTensor::from_local((target.to_local() != options.ignore_idx).sum().to(at::kFloat), mesh,
                          sums, std::vector<int64_t>{})
          .redistribute(whole)
          .to_local();
  return DTensor::from_local(total / count.clamp_min(1), mesh, whole, std::vector<int64_t>{});
}

}  // namespace te::nn::functional
