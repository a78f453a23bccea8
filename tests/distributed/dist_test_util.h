#pragma once

// Helpers shared by the distributed tests: deterministic data and one-process slicing.

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "te/distributed.h"

namespace te::test {

/// Integer-valued doubles in [-9, 9], the same on every rank and thread for a given seed, so sums
/// and averages over 2 or 4 ranks are exact.
inline at::Tensor seeded_integers(const std::vector<int64_t>& shape, int64_t seed) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  at::Tensor idx = at::arange(n, at::kLong);
  at::Tensor mixed =
      at::remainder(idx * int64_t{2654435761} + int64_t{seed * 40503 + 12345}, int64_t{19}) - 9;
  return mixed.to(at::kDouble).view(shape);
}

/// This rank's piece of `global` under `placements` (Partial and Replicate keep the whole dim).
inline at::Tensor piece_of(const at::Tensor& global, const DeviceMesh& mesh,
                           const std::vector<Placement>& placements, int64_t rank) {
  const std::vector<int64_t> shape(global.sizes().begin(), global.sizes().end());
  at::Tensor out = global;
  const auto chunks = local_chunks(shape, mesh, placements, rank);
  for (std::size_t d = 0; d < chunks.size(); ++d) {
    out = out.narrow(static_cast<int64_t>(d), chunks[d].offset, chunks[d].length);
  }
  return out.contiguous();
}

inline std::string text(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::to_string(v[i]);
  return out + "]";
}

}  // namespace te::test
