#pragma once

// Helpers shared by the te::nn tests.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "te/fp8/recipe.h"

namespace te::nn::test {

/// Every FP8 recipe at its defaults (block scaling on HYBRID without power-of-2 scales; NVFP4
/// without stochastic rounding, whose draws are each rank's own), for the tests that hold each.
inline std::vector<fp8::Recipe> every_fp8_recipe() {
  fp8::NVFP4BlockScaling nvfp4;
  nvfp4.disable_stochastic_rounding = true;
  return {fp8::DelayedScaling{}, fp8::CurrentScaling{},
          fp8::Float8BlockScaling{fp8::Format::kHybrid, false, 0.0f},
          fp8::MXFP8BlockScaling{fp8::Format::kHybrid}, nvfp4};
}

/// Relative closeness for fp32: max |a - b| <= tol * max(1, max |b|).
inline ::testing::AssertionResult Close(const at::Tensor& a, const at::Tensor& b,
                                        double tol = 1e-6) {
  if (a.sizes() != b.sizes()) {
    return ::testing::AssertionFailure() << "shapes " << a.sizes() << " vs " << b.sizes();
  }
  const double err = (a - b).abs().max().item<double>();
  const double scale = std::max(1.0, b.abs().max().item<double>());
  if (err <= tol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max abs error " << err << " > " << tol * scale;
}

/// A detached copy that records its own gradient (the reference's leaf).
inline at::Tensor leaf(const at::Tensor& t) { return t.detach().clone().requires_grad_(true); }

/// Normal values from a generator of its own, so tests do not depend on the global RNG.
inline at::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randn(shape, g);
}

/// A padding mask [batch, 1, sq, sk] as TE's encoder builds it: true where the key is at or
/// beyond its row's key length `lk`, or the query at or beyond its query length `lq`.
inline at::Tensor padding_mask(const std::vector<int64_t>& lq, const std::vector<int64_t>& lk,
                               int64_t sq, int64_t sk) {
  const at::Tensor q = at::tensor(lq).view({-1, 1, 1, 1}), k = at::tensor(lk).view({-1, 1, 1, 1});
  return at::arange(sk)
      .view({1, 1, 1, sk})
      .ge(k)
      .logical_or(at::arange(sq).view({1, 1, sq, 1}).ge(q));
}

}  // namespace te::nn::test
