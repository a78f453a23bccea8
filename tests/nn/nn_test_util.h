#pragma once

// Helpers shared by the te::nn tests.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace te::nn::test {

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

}  // namespace te::nn::test
