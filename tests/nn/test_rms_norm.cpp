// RMSNorm (functional::layer_norm with rms) on te's CPU kernel, held to the formula in float64:
// Llama's form and the zero-centered one, float32 and bfloat16, forward and both gradients, on
// shapes that leave tails (a row of 37, 70 rows); the same bits on one thread and two; a
// gradient of the gradient; meta tensors (te::nn::plan) give shapes and allocate.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <vector>

#include "nn_test_util.h"
#include "te/nn.h"

namespace te::nn {
namespace {

namespace F = functional;
using test::Close;
using test::randn;

struct Result {
  at::Tensor y, dx, dgamma;
};

Result run(const at::Tensor& x0, const at::Tensor& g0, const at::Tensor& dy, bool zero_centered) {
  const at::Tensor x = x0.clone().requires_grad_(), g = g0.clone().requires_grad_();
  const at::Tensor y = F::layer_norm(x, g, {}, 1e-5, zero_centered, /*rms=*/true);
  y.backward(dy);
  return {y.detach(), x.grad(), g.grad()};
}

// In float64 from the same (rounded) inputs: Llama's rounds the normalised row to x's dtype
// before the scale; the bound covers that rounding and the kernel's float32.
Result reference(const at::Tensor& x0, const at::Tensor& g0, const at::Tensor& dy,
                 bool zero_centered) {
  const at::Tensor x = x0.to(at::kDouble).requires_grad_(), g = g0.to(at::kDouble).requires_grad_();
  const at::Tensor n = x * at::rsqrt(x.pow(2).mean({-1}, true) + 1e-5);
  const at::Tensor y = zero_centered ? n * (g + 1) : n * g;
  y.backward(dy.to(at::kDouble));
  return {y.detach(), x.grad(), g.grad()};
}

TEST(RmsNorm, KernelIsTheFormulaInEachDtypeAndForm) {
  for (const at::ScalarType type : {at::kFloat, at::kBFloat16}) {
    for (const bool zero_centered : {false, true}) {
      SCOPED_TRACE(std::string(c10::toString(type)) + (zero_centered ? " zero-centered" : ""));
      const at::Tensor x = randn({2, 35, 37}, 1).to(type), g = (randn({37}, 2) * 0.5).to(type),
                       dy = randn({2, 35, 37}, 3).to(type);
      const Result got = run(x, g, dy, zero_centered), want = reference(x, g, dy, zero_centered);
      EXPECT_EQ(got.y.scalar_type(), type);
      EXPECT_EQ(got.dgamma.scalar_type(), type);
      // float32: rounding; bfloat16: two or three roundings of 2^-8 relative each.
      const double tol = type == at::kFloat ? 1e-5 : 2e-2;
      EXPECT_TRUE(Close(got.y.to(at::kDouble), want.y, tol)) << "y";
      EXPECT_TRUE(Close(got.dx.to(at::kDouble), want.dx, tol)) << "dx";
      EXPECT_TRUE(Close(got.dgamma.to(at::kDouble), want.dgamma, tol)) << "dgamma";
    }
  }
}

TEST(RmsNorm, SameBitsOnOneThreadAndTwo) {
  const at::Tensor x = randn({70, 64}, 4), g = randn({64}, 5), dy = randn({70, 64}, 6);
  const int before = at::get_num_threads();
  at::set_num_threads(1);
  const Result one = run(x, g, dy, false);
  at::set_num_threads(2);
  const Result two = run(x, g, dy, false);
  at::set_num_threads(before);
  EXPECT_TRUE(at::equal(one.y, two.y));
  EXPECT_TRUE(at::equal(one.dx, two.dx));
  EXPECT_TRUE(at::equal(one.dgamma, two.dgamma));
}

TEST(RmsNorm, GradientOfTheGradientIsTheFormulas) {
  const at::Tensor x0 = randn({3, 16}, 7), g0 = randn({16}, 8), dy = randn({3, 16}, 9);
  auto second = [&](bool kernel) {
    const at::Tensor x = (kernel ? x0 : x0.to(at::kDouble)).clone().requires_grad_();
    const at::Tensor g = (kernel ? g0 : g0.to(at::kDouble)).clone().requires_grad_();
    const at::Tensor y = kernel ? F::layer_norm(x, g, {}, 1e-5, false, true)
                                : x * at::rsqrt(x.pow(2).mean({-1}, true) + 1e-5) * g;
    const auto dx = torch::autograd::grad({y}, {x}, {dy.to(y.scalar_type())}, true, true);
    dx[0].pow(2).sum().backward();
    return std::vector<at::Tensor>{x.grad().to(at::kDouble), g.grad().to(at::kDouble)};
  };
  const auto got = second(true), want = second(false);
  EXPECT_TRUE(Close(got[0], want[0], 1e-4));
  EXPECT_TRUE(Close(got[1], want[1], 1e-4));
}

TEST(RmsNorm, MetaTensorsGiveShapes) {
  const auto meta = at::TensorOptions().device(at::kMeta);
  const at::Tensor x = at::empty({4, 8, 32}, meta).requires_grad_(),
                   g = at::empty({32}, meta).requires_grad_();
  const at::Tensor y = F::layer_norm(x, g, {}, 1e-6, false, true);
  EXPECT_TRUE(y.is_meta());
  EXPECT_EQ(y.sizes(), x.sizes());
  y.backward(at::empty_like(y));
  EXPECT_EQ(x.grad().sizes(), x.sizes());
  EXPECT_EQ(g.grad().sizes(), g.sizes());
}

}  // namespace
}  // namespace te::nn
