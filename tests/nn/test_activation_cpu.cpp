// te's CPU activation kernels (modules/src/activation_cpu.cpp): the tanh-form gelu
// (functional::activation "gelu", TE's default) and SiLU ("silu"), each forward and gradient
// against the exact math in double and against LibTorch's in fp32, over every bf16 value, random
// and edge values (0, -0, denormals, +-large, +-inf, NaN), in bf16, fp16 and fp32, contiguous or
// not, and a double backward.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include "te/nn.h"

namespace te::nn {
namespace {

namespace F = functional;

constexpr double kC = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kK = 0.044715;

at::Tensor te_gelu(const at::Tensor& x) { return F::activation(x, "gelu"); }

// The exact math in double: 0.5 x (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + k x^3).
at::Tensor gelu_double(const at::Tensor& x) {
  const at::Tensor xd = x.to(at::kDouble);
  return xd * at::sigmoid(2 * kC * (xd + kK * xd.pow(3)));
}
// (`terms`: |g| (|s| + |x s (1 - s) 2u'|), what the gradient's rounding scales with where its
// two terms cancel, around x = -0.75)
at::Tensor gelu_grad_double(const at::Tensor& g, const at::Tensor& x, bool terms = false) {
  const at::Tensor xd = x.to(at::kDouble);
  const at::Tensor s = at::sigmoid(2 * kC * (xd + kK * xd.pow(3)));
  const at::Tensor right = xd * s * (1 - s) * 2 * kC * (1 + 3 * kK * xd * xd);
  if (terms) return g.to(at::kDouble).abs() * (s + right.abs());
  return g.to(at::kDouble) * (s + right);
}

int mantissa_bits(at::ScalarType t) { return t == at::kBFloat16 ? 7 : t == at::kHalf ? 10 : 23; }

// Each element of `got` within `ulps` units in the last place (of `want`, in `dtype`) of
// `want`, plus `slack` (absolute, per element, or 0); NaN exactly where `want` is NaN,
// infinities equal.
::testing::AssertionResult Near(const at::Tensor& x, const at::Tensor& got_in,
                                const at::Tensor& want_in, at::ScalarType dtype, double ulps,
                                const at::Tensor& slack = {}) {
  const at::Tensor got = got_in.to(at::kDouble).flatten(), want = want_in.to(at::kDouble).flatten();
  // (below the normal range, the subnormals' spacing)
  const double spacing = dtype == at::kBFloat16 ? 0x1p-133
                         : dtype == at::kHalf   ? 0x1p-24
                                                : 0x1p-149;
  const at::Tensor ulp =
      at::exp2(at::floor(at::log2(want.abs().clamp_min(1e-300))) - mantissa_bits(dtype))
          .clamp_min(spacing);
  const at::Tensor finite = want.isfinite() & got.isfinite();
  at::Tensor err = at::where(finite, (got - want).abs() - ulps * ulp, at::zeros_like(want));
  if (slack.defined()) err = err - slack.to(at::kDouble).flatten();
  const at::Tensor bad = (err > 0) | (got.isnan() != want.isnan()) |
                         (want.isinf() & (got != want)) | (got.isinf() & (got != want));
  const int64_t n = bad.sum().item<int64_t>();
  if (n == 0) return ::testing::AssertionSuccess();
  const int64_t i = bad.nonzero()[0][0].item<int64_t>();
  std::ostringstream os;
  os.precision(9);
  os << n << " of " << got.numel() << " elements off; the first: x "
     << x.flatten()[i].item<double>() << " got " << got[i].item<double>() << " want "
     << want[i].item<double>();
  return ::testing::AssertionFailure() << os.str();
}

// Where |u| is large, at::gelu's tanh(u) is within an fp32 ulp of +-1 and 1 + tanh(u) (x < 0)
// or 1 - tanh(u)^2 (the gradient) cancels: an absolute error of up to |x| 2^-24 in the forward,
// and |g| |x|^3 2^-24 or so in the gradient.
at::Tensor cancelled(const at::Tensor& x, const at::Tensor& g = {}) {
  const at::Tensor a = x.to(at::kDouble).abs().nan_to_num(0, 0, 0);
  if (!g.defined()) return 2e-7 * at::relu(-x.to(at::kDouble)).nan_to_num(0, 0, 0);
  return 2e-7 * g.to(at::kDouble).abs() * (a + a.pow(3));
}

// fp32 math's own error in the tail: exp(-|2u|) there amplifies 2u's rounding (a few fp32 ulps of
// 2u, without FMA) |2u|-fold; and below x ~ -10, where exp(-|2u|) is under FLT_MIN, the result is
// 0 (so is at::gelu's).
at::Tensor conditioned(const at::Tensor& x, const at::Tensor& want) {
  const at::Tensor xd = x.to(at::kDouble).nan_to_num(0, 0, 0).flatten();
  const at::Tensor z = 2 * kC * xd.abs() * (1 + kK * xd * xd);
  return 0x1p-22 * (2 + z) * want.to(at::kDouble).abs().flatten() + 1e-35;
}

// Every bf16 bit pattern.
at::Tensor every_bf16() {
  return at::arange(0, 65536, at::kInt).to(at::kShort).view(at::kBFloat16);
}

// Random values and the edges, in `dtype`.
at::Tensor samples(at::ScalarType dtype) {
  at::manual_seed(3);
  const float inf = std::numeric_limits<float>::infinity();
  const float big = dtype == at::kHalf ? 6e4f : 1e30f;
  const std::vector<float> edges = {0.f,    -0.f,  1e-40f, -1e-40f, 1e-30f, -1e-30f, 5.f,    -5.f,
                                    -9.f,   -10.f, -12.f,  20.f,    -20.f,  100.f,   -100.f, 1e10f,
                                    -1e10f, big,   -big,   inf,     -inf,   NAN};
  return at::cat({at::randn({1 << 16}) * 4, at::tensor(edges)}).to(dtype);
}

// The forward and the input's gradient through autograd (the gradient `g`, or a sum's).
std::pair<at::Tensor, at::Tensor> run(const at::Tensor& x, const at::Tensor& g) {
  const at::Tensor leaf = x.detach().clone().requires_grad_(true);
  const at::Tensor y = te_gelu(leaf);
  if (g.defined()) {
    y.backward(g);
  } else {
    y.sum().backward();
  }
  return {y.detach(), leaf.grad()};
}

TEST(GeluTanh, EveryBf16ValueIsTheExactMathRounded) {
  const at::Tensor x = every_bf16();
  const at::Tensor y = te_gelu(x);
  ASSERT_EQ(y.scalar_type(), at::kBFloat16);
  // Below x = -10 the exact value is under FLT_MIN; the kernel gives -0 there, as at::gelu does.
  EXPECT_TRUE(Near(x, y, gelu_double(x), at::kBFloat16, 1.0, at::full({1}, 1e-35)));
  // All but a handful of the 65536 are the exact value rounded to nearest.
  const at::Tensor rounded = gelu_double(x).to(at::kBFloat16);
  const at::Tensor same =
      (y.view(at::kShort) == rounded.view(at::kShort)) | (y.isnan() & rounded.isnan());
  EXPECT_LE(65536 - same.sum().item<int64_t>(), 8);
}

TEST(GeluTanh, EveryBf16ValueAgainstAtGeluInFp32) {
  const at::Tensor x = every_bf16();
  const at::Tensor y = te_gelu(x);
  const at::Tensor want = at::gelu(x.to(at::kFloat), "tanh");
  // at::gelu's 1 + tanh(u) cancels for x < 0 (an absolute error of up to ~|x| 2^-24); the rest
  // is one bf16 rounding.
  EXPECT_TRUE(Near(x, y, want, at::kBFloat16, 1.0, cancelled(x)));
  const std::vector<float> xs = {0.f, -0.f, 1.f, -1.f, 3.f, -3.f};
  for (float v : xs) {
    const at::Tensor one = at::full({1}, v).to(at::kBFloat16);
    EXPECT_TRUE(at::equal(te_gelu(one).view(at::kShort),
                          at::gelu(one.to(at::kFloat), "tanh").to(at::kBFloat16).view(at::kShort)))
        << "x " << v;
  }
}

TEST(GeluTanh, EdgeValues) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const float inf = std::numeric_limits<float>::infinity();
    const float big = dtype == at::kHalf ? 6e4f : 1e30f;
    const at::Tensor x = at::tensor({0.f, -0.f, inf, -inf, NAN, -big}).to(dtype);
    const at::Tensor y = te_gelu(x).to(at::kFloat);
    EXPECT_EQ(y[0].item<float>(), 0.f);
    EXPECT_FALSE(std::signbit(y[0].item<float>()));
    EXPECT_TRUE(std::signbit(y[1].item<float>()) && y[1].item<float>() == 0.f);
    EXPECT_EQ(y[2].item<float>(), inf);
    EXPECT_TRUE(std::isnan(y[3].item<float>()));  // -inf * 0, as at::gelu
    EXPECT_TRUE(std::isnan(y[4].item<float>()));
    EXPECT_EQ(y[5].item<float>(), 0.f);
    // A denormal x: te_gelu(x) = x / 2.
    if (dtype != at::kHalf) {
      const at::Tensor d = at::full({1}, 1e-40f).to(dtype);
      EXPECT_EQ(te_gelu(d).to(at::kFloat).item<float>(),
                (d.to(at::kFloat) / 2).to(dtype).to(at::kFloat).item<float>());
    }
  }
}

TEST(GeluTanh, ForwardAndGradientInEachDtype) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    const at::Tensor x = samples(dtype);
    const at::Tensor g = at::randn(x.sizes()).to(dtype);
    const double ulps = dtype == at::kFloat ? 4.0 : 1.0;
    for (bool given : {true, false}) {
      SCOPED_TRACE(given ? "gradient given" : "gradient of a sum (one value expanded)");
      const at::Tensor gg = given ? g : at::ones_like(g);
      const auto [y, dx] = run(x, given ? g : at::Tensor());
      ASSERT_EQ(dx.scalar_type(), dtype);
      // The exact math (|x| < 1e19: beyond, x^2 overflows fp32, and the gradient is NaN, as
      // at::gelu_backward's).
      const at::Tensor in_range = x.to(at::kFloat).abs() < 1e19;
      const at::Tensor want = gelu_double(x);
      EXPECT_TRUE(Near(x, y, want, dtype, ulps, conditioned(x, want)));
      const at::Tensor xr = x.masked_select(in_range);
      const at::Tensor want_dx = gelu_grad_double(gg, x).masked_select(in_range);
      const at::Tensor terms = gelu_grad_double(gg, x, true).masked_select(in_range);
      EXPECT_TRUE(Near(xr, dx.masked_select(in_range), want_dx, dtype, ulps,
                       conditioned(xr, want_dx) + 0x1p-22 * terms));
      // LibTorch's, in fp32 (its bf16 kernel on LibTorch 1.13 rounds every step to bf16); where
      // 1 + tanh cancels, within its error.
      const at::Tensor xf = x.to(at::kFloat);
      EXPECT_TRUE(Near(x, y, at::gelu(xf, "tanh").to(dtype), dtype, ulps, cancelled(x)));
      EXPECT_TRUE(Near(x, dx, at::gelu_backward(gg.to(at::kFloat), xf, "tanh").to(dtype), dtype,
                       ulps, cancelled(x, gg)));
    }
  }
}

TEST(GeluTanh, StridedInputsAndGradientsAreTheContiguousResult) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    const at::Tensor h = (at::randn({8, 2, 600}) * 4).to(dtype);
    // A gated MLP's slot (rows apart), every other element (no unit stride: the copied path),
    // and a transposed gradient.
    for (const at::Tensor& x : {h.select(1, 0), h.select(1, 1).slice(1, 0, 600, 2)}) {
      ASSERT_FALSE(x.is_contiguous());
      EXPECT_TRUE(at::equal(te_gelu(x), te_gelu(x.contiguous())));
      const at::Tensor g = at::randn({x.size(1), 8}).to(dtype).t();
      const auto [y1, dx1] = run(x, g);
      const auto [y2, dx2] = run(x.contiguous(), g.contiguous());
      EXPECT_TRUE(at::equal(y1, y2));
      EXPECT_TRUE(at::equal(dx1, dx2));
    }
  }
}

TEST(GeluTanh, DoubleBackwardIsAtGelus) {
  const at::Tensor x = (at::randn({64}) * 3).requires_grad_(true);
  const at::Tensor ref = x.detach().clone().requires_grad_(true);
  auto second = [](const at::Tensor& leaf, const at::Tensor& y) {
    const at::Tensor dx = torch::autograd::grad({y.sum()}, {leaf}, {}, true, true)[0];
    return torch::autograd::grad({dx.sum()}, {leaf})[0];
  };
  EXPECT_TRUE(at::allclose(second(x, te_gelu(x)), second(ref, at::gelu(ref, "tanh")), 1e-5, 1e-6));
}

// ---- SiLU ----------------------------------------------------------------------------------

at::Tensor te_silu(const at::Tensor& x) { return F::activation(x, "silu"); }

// x sigmoid(x) and its derivative sigmoid (1 + x (1 - sigmoid)) in double; `terms`: the sizes of
// the derivative's two terms times |g| (where they cancel, near x = -1.28, the rounding of the
// larger one is what remains).
at::Tensor silu_double(const at::Tensor& x) {
  const at::Tensor xd = x.to(at::kDouble);
  return xd * at::sigmoid(xd);
}
at::Tensor silu_grad_double(const at::Tensor& g, const at::Tensor& x, bool terms = false) {
  const at::Tensor xd = x.to(at::kDouble), s = at::sigmoid(xd);
  if (terms) return g.to(at::kDouble).abs() * (s + (xd * s * (1 - s)).abs());
  return g.to(at::kDouble) * (s + xd * s * (1 - s));
}

TEST(Silu, EveryBf16ValueIsTheExactMathRounded) {
  const at::Tensor x = every_bf16();
  const at::Tensor y = te_silu(x);
  ASSERT_EQ(y.scalar_type(), at::kBFloat16);
  // Below x = -87 the exact value is under FLT_MIN; the kernel gives -0 there.
  EXPECT_TRUE(Near(x, y, silu_double(x), at::kBFloat16, 1.0, at::full({1}, 1e-35)));
  // All but a few dozen of the 65536 are the exact value rounded to nearest (20 here: fp32's
  // result next to a bf16 tie, rounded twice).
  const at::Tensor rounded = silu_double(x).to(at::kBFloat16);
  const at::Tensor same =
      (y.view(at::kShort) == rounded.view(at::kShort)) | (y.isnan() & rounded.isnan());
  EXPECT_LE(65536 - same.sum().item<int64_t>(), 40);
}

TEST(Silu, ForwardAndGradientInEachDtype) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    const at::Tensor x = samples(dtype);
    const at::Tensor g = at::randn(x.sizes()).to(dtype);
    const at::Tensor leaf = x.detach().clone().requires_grad_(true);
    const at::Tensor y = te_silu(leaf);
    y.backward(g);
    const at::Tensor dx = leaf.grad();
    ASSERT_EQ(dx.scalar_type(), dtype);
    const double ulps = dtype == at::kFloat ? 4.0 : 1.0;
    // exp's argument's rounding, |x|-fold in the tail, and below FLT_MIN zero.
    const at::Tensor want = silu_double(x);
    const at::Tensor tail = 0x1p-22 * (2 + x.to(at::kDouble).abs().nan_to_num(0, 0, 0).flatten()) *
                                want.abs().flatten() +
                            1e-35;
    EXPECT_TRUE(Near(x, y.detach(), want, dtype, ulps, tail));
    const at::Tensor terms = silu_grad_double(g, x, true).nan_to_num(0, 0, 0).flatten();
    EXPECT_TRUE(Near(
        x, dx, silu_grad_double(g, x), dtype, ulps,
        0x1p-22 * (2 + x.to(at::kDouble).abs().nan_to_num(0, 0, 0).flatten()) * terms + 1e-35));
    // LibTorch's, in fp32.
    const at::Tensor xf = x.to(at::kFloat);
    EXPECT_TRUE(Near(x, y.detach(), at::silu(xf).to(dtype), dtype, ulps, tail));
  }
}

TEST(Silu, StridedInputsAndDoubleBackwardAreLibTorchs) {
  const at::Tensor h = (at::randn({8, 2, 600}) * 4).to(at::kBFloat16);
  const at::Tensor x = h.select(1, 1).slice(1, 0, 600, 2);
  ASSERT_FALSE(x.is_contiguous());
  EXPECT_TRUE(at::equal(te_silu(x), te_silu(x.contiguous())));
  const at::Tensor a = (at::randn({64}) * 3).requires_grad_(true);
  const at::Tensor ref = a.detach().clone().requires_grad_(true);
  auto second = [](const at::Tensor& leaf, const at::Tensor& y) {
    const at::Tensor dx = torch::autograd::grad({y.sum()}, {leaf}, {}, true, true)[0];
    return torch::autograd::grad({dx.sum()}, {leaf})[0];
  };
  EXPECT_TRUE(at::allclose(second(a, te_silu(a)), second(ref, at::silu(ref)), 1e-5, 1e-6));
}

}  // namespace
}  // namespace te::nn
