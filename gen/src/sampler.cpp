// te::gen::Sampler: transformers' logits processors (repetition penalty, temperature, top-k,
// top-p, min-p) and OpenAI's presence and frequency penalties over one request's logits, and the
// draw from what they leave.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "te/error.h"
#include "te/gen/generate.h"

namespace te::gen {

std::optional<BadField> sampling_problem(const SamplingOptions& o, const std::string& who) {
  auto bad = [&](const char* field, auto value, const char* rule) {
    std::ostringstream message;
    message << who << "." << field << " " << value << " must be " << rule;
    return BadField{field, message.str()};
  };
  if (!(std::isfinite(o.temperature) && o.temperature >= 0)) {
    return bad("temperature", o.temperature, ">= 0 (0: greedy)");
  }
  if (o.top_k < 0) return bad("top_k", o.top_k, ">= 0 (0: off)");
  if (!(o.top_p > 0 && o.top_p <= 1)) return bad("top_p", o.top_p, "in (0, 1]");
  if (!(o.min_p >= 0 && o.min_p <= 1)) return bad("min_p", o.min_p, "in [0, 1]");
  if (!(std::isfinite(o.repetition_penalty) && o.repetition_penalty > 0)) {
    return bad("repetition_penalty", o.repetition_penalty, "> 0 (1: off)");
  }
  if (!(o.presence_penalty >= -2 && o.presence_penalty <= 2)) {
    return bad("presence_penalty", o.presence_penalty, "in [-2, 2] (0: off)");
  }
  if (!(o.frequency_penalty >= -2 && o.frequency_penalty <= 2)) {
    return bad("frequency_penalty", o.frequency_penalty, "in [-2, 2] (0: off)");
  }
  return std::nullopt;
}

void check_sampling(const SamplingOptions& o, const std::string& who) {
  if (const std::optional<BadField> bad = sampling_problem(o, who)) TE_FAIL(bad->message);
}

bool SamplingOptions::is_greedy() const {
  return temperature == 0 && repetition_penalty == 1.0 && presence_penalty == 0 &&
         frequency_penalty == 0;
}

Sampler::Sampler(const SamplingOptions& options) : options_(options), random_(options.seed) {
  check_sampling(options_);
}

at::Tensor Sampler::distribution(const at::Tensor& logits, const std::vector<int64_t>& context,
                                 std::size_t generated_from) const {
  TE_CHECK(logits.dim() == 1, "Sampler: logits must be [vocab], got ", logits.sizes());
  const SamplingOptions& o = options_;
  at::Tensor l = logits.detach().to(at::kCPU, at::kFloat).clone();
  const int64_t vocab = l.size(0);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (o.repetition_penalty != 1.0) {  // RepetitionPenaltyLogitsProcessor
    auto* p = l.data_ptr<float>();
    const auto penalty = static_cast<float>(o.repetition_penalty);
    for (int64_t id : std::set<int64_t>(context.begin(), context.end())) {
      if (id < 0 || id >= vocab) continue;
      p[id] = p[id] < 0 ? p[id] * penalty : p[id] / penalty;
    }
  }
  if (o.presence_penalty != 0 || o.frequency_penalty != 0) {  // OpenAI's, as vLLM's
    std::map<int64_t, int64_t> counts;
    for (std::size_t i = std::min(generated_from, context.size()); i < context.size(); ++i) {
      ++counts[context[i]];
    }
    auto* p = l.data_ptr<float>();
    for (const auto& [id, n] : counts) {
      if (id < 0 || id >= vocab) continue;
      p[id] -=
          static_cast<float>(o.frequency_penalty * static_cast<double>(n) + o.presence_penalty);
    }
  }
  if (o.temperature == 0) {
    return at::zeros({vocab}, at::kFloat).index_fill_(0, l.argmax(), 1.0);
  }
  if (o.temperature != 1.0) l = l / o.temperature;  // TemperatureLogitsWarper
  if (o.top_k > 0 && o.top_k < vocab) {             // TopKLogitsWarper: ties with the k-th kept
    const at::Tensor kth = std::get<0>(at::topk(l, o.top_k)).select(0, o.top_k - 1);
    l = l.masked_fill(l < kth, neg_inf);
  }
  if (o.top_p < 1.0) {  // TopPLogitsWarper: drop the least likely whose mass is <= 1 - top_p
    const auto [sorted, order] = at::sort(l, /*dim=*/0, /*descending=*/false);
    at::Tensor drop = sorted.softmax(0).cumsum(0) <= (1.0 - o.top_p);
    drop.select(0, vocab - 1).fill_(false);
    l = l.masked_fill(at::zeros_like(drop).scatter_(0, order, drop), neg_inf);
  }
  if (o.min_p > 0) {  // MinPLogitsWarper: below min_p x the top probability
    const at::Tensor probs = l.softmax(0);
    at::Tensor drop = probs < probs.max() * o.min_p;
    drop.index_fill_(0, probs.argmax(), false);
    l = l.masked_fill(drop, neg_inf);
  }
  return l.softmax(0);
}

int64_t Sampler::next(const at::Tensor& logits, const std::vector<int64_t>& context,
                      std::size_t generated_from) {
  if (options_.is_greedy()) {
    return logits.argmax().item<int64_t>();  // greedy: distribution()'s one-hot, without it
  }
  const at::Tensor probs = distribution(logits, context, generated_from);
  if (options_.temperature == 0) return probs.argmax().item<int64_t>();
  // One uniform draw in [0, 1) with 53 random bits, then the first id whose cumulative
  // probability passes it (in double, over the ids in order).
  const double u = static_cast<double>(random_() >> 11) * 0x1.0p-53;
  const at::Tensor cdf = probs.to(at::kDouble).cumsum(0);
  const auto* c = cdf.data_ptr<double>();
  const int64_t vocab = cdf.size(0);
  const double total = c[vocab - 1];
  int64_t id = std::upper_bound(c, c + vocab, u * total) - c;
  id = std::min(id, vocab - 1);
  while (id > 0 && probs[id].item<float>() == 0) --id;  // never a filtered-out token
  return id;
}

}  // namespace te::gen
