// The seeded permutation every order of te::train comes from, and the held-out split.

#include <cmath>
#include <random>

#include "te/error.h"
#include "te/train/loader.h"

namespace te::train {

std::vector<int64_t> shuffled(int64_t n, uint64_t seed) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = i;
  // mt19937_64's output is fixed by the standard; std::shuffle and the distributions are not, so
  // the swap index comes from the raw output (its modulo bias is below 2^-40 for any n here).
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(out[i], out[j]);
  }
  return out;
}

Split split_documents(int64_t num_documents, double eval_fraction, int64_t eval_count,
                      uint64_t seed) {
  TE_CHECK(eval_fraction >= 0.0 && eval_fraction < 1.0, "eval fraction ", eval_fraction,
           " is outside [0, 1); hold out a fraction below 1 (te-train --eval-fraction)");
  TE_CHECK(eval_count >= 0, "eval count ", eval_count,
           " is negative; hold out 0 or more documents (te-train --eval-count)");
  int64_t held = eval_count;
  if (held == 0 && eval_fraction > 0.0)
    held = std::max<int64_t>(1, std::llround(eval_fraction * static_cast<double>(num_documents)));
  TE_CHECK(held < num_documents, "holding out ", held, " of ", num_documents,
           " documents leaves none for training; hold out fewer (te-train --eval-fraction, "
           "--eval-count) or give a separate --eval-data file");
  // Another stream than the packing's and the epochs' orders (which seed with `seed` mixed).
  const std::vector<int64_t> perm = shuffled(num_documents, seed ^ 0x5eed5eed5eed5eedULL);
  Split split;
  std::vector<bool> is_eval(static_cast<size_t>(num_documents), false);
  for (int64_t i = 0; i < held; ++i) is_eval[perm[i]] = true;
  for (int64_t d = 0; d < num_documents; ++d) (is_eval[d] ? split.eval : split.train).push_back(d);
  return split;
}

}  // namespace te::train
