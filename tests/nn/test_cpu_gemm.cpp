// te::nn's float32 CPU GEMMs without autograd on oneDNN (modules/src/cpu_gemm.cpp): equal to a
// float64 product on every layout the modules hand it, taken only where no autograd graph or CPU
// autocast needs LibTorch's, and TE_CPU_GEMM read as documented (te/nn/inference.h).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "../cpu_autocast.h"
#include "../expect_error.h"
#include "te/nn.h"

namespace {

namespace F = te::nn::functional;

// oneDNN where the build has it (TE_BUILT_WITH_ONEDNN, from CMake's choice) unless TE_CPU_GEMM
// says libtorch: a build that quietly lost oneDNN fails here.
bool expect_onednn() {
  const char* env = std::getenv("TE_CPU_GEMM");
  const bool libtorch = env != nullptr && std::string(env) == "libtorch";
#if defined(TE_BUILT_WITH_ONEDNN)
  const bool built = true;
#else
  const bool built = false;
#endif
  EXPECT_EQ(te::nn::cpu_gemm_library(), built && !libtorch ? "onednn" : "libtorch");
  return built && !libtorch;
}

// x @ w + bias in float64, rounded once.
at::Tensor reference(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  at::Tensor y = at::matmul(x.to(at::kDouble), w.to(at::kDouble));
  if (bias.defined()) y = y + bias.to(at::kDouble);
  return y.to(at::kFloat);
}

// The layouts of w [K, N] a module hands the GEMM: a kernel, a kernel whose rows are padded
// (a narrowed wider tensor), a table [N, K] transposed (a tied LM head), and a padded table.
std::vector<at::Tensor> layouts(int64_t k, int64_t n) {
  return {at::randn({k, n}), at::randn({k, n + 3}).narrow(1, 0, n), at::randn({n, k}).t(),
          at::randn({n, k + 5}).narrow(1, 0, k).t()};
}

// The inputs: rows contiguous, batched [2, m, k], rows padded (handed to oneDNN with their row
// stride), a transposed view and rows broadcast (both copied first).
std::vector<at::Tensor> inputs(int64_t m, int64_t k) {
  return {at::randn({m, k}), at::randn({2, m, k}), at::randn({m, k + 7}).narrow(1, 0, k),
          at::randn({k, m}).t(), at::randn({1, k}).expand({m, k})};
}

TEST(CpuGemm, EqualsTheFloat64ProductOnEveryLayout) {
  at::manual_seed(0);
  const at::NoGradGuard no_grad;
  const bool onednn = expect_onednn();
  for (const int64_t m : {1, 3, 32, 130}) {
    for (const auto& [k, n] :
         {std::pair<int64_t, int64_t>{1, 1}, {1, 5}, {17, 1}, {17, 5}, {576, 192}}) {
      for (const at::Tensor& w : layouts(k, n)) {
        for (const bool with_bias : {false, true}) {
          for (const at::Tensor& x : inputs(m, k)) {
            // A strided bias (every other element of a wider tensor) is copied first.
            const at::Tensor bias = with_bias ? at::randn({n, 2}).select(1, 0) : at::Tensor();
            const int64_t before = te::nn::onednn_gemm_count();
            const at::Tensor y = F::dense(x, w, nullptr, nullptr, bias);
            const at::Tensor want = reference(x, w, bias);
            SCOPED_TRACE(::testing::Message() << "x " << x.sizes() << x.strides() << " w "
                                              << w.sizes() << w.strides() << " bias " << with_bias);
            ASSERT_EQ(y.sizes(), want.sizes());
            // fp32 accumulation over k terms of |x||w| ~ 1.
            EXPECT_LE((y - want).abs().max().item<double>(), 2e-6 * static_cast<double>(k) + 1e-6);
            EXPECT_EQ(te::nn::onednn_gemm_count() - before, onednn ? 1 : 0);
          }
        }
      }
    }
  }
}

TEST(CpuGemm, GraphsAutocastAndOtherDtypesStayOnLibTorch) {
  at::manual_seed(1);
  const at::Tensor w = at::randn({64, 48}).requires_grad_();
  const at::Tensor x = at::randn({8, 64});
  const int64_t before = te::nn::onednn_gemm_count();
  // An autograd graph: LibTorch's GEMM, which records the backward.
  const at::Tensor y = F::dense(x, w);
  ASSERT_TRUE(y.requires_grad());
  y.sum().backward();
  EXPECT_TRUE(at::allclose(w.grad(), x.sum(0).unsqueeze(1).expand({64, 48}), 1e-5, 1e-5));
  // float64, bf16 operands and CPU autocast.
  {
    const at::NoGradGuard no_grad;
    F::dense(x.to(at::kDouble), w.detach().to(at::kDouble));
    F::dense(x.to(at::kBFloat16), w.detach().to(at::kBFloat16));
    const te::test::CpuAutocast autocast(true, at::kBFloat16);
    EXPECT_EQ(F::dense(x, w.detach()).scalar_type(), at::kBFloat16);
  }
  EXPECT_EQ(te::nn::onednn_gemm_count(), before);
  // The same product without a graph runs on oneDNN (where built) and equals LibTorch's.
  {
    const at::NoGradGuard no_grad;
    EXPECT_TRUE(at::allclose(F::dense(x, w.detach()), y.detach(), 1e-5, 1e-5));
  }
  EXPECT_EQ(te::nn::onednn_gemm_count() - before, expect_onednn() ? 1 : 0);
}

// Run by ctest with TE_CPU_GEMM=libtorch (nn.CpuGemmEnv.libtorch) and TE_CPU_GEMM=x
// (nn.CpuGemmEnv.unknown); skipped otherwise.
TEST(CpuGemmEnv, ChoosesTheLibraryOrNamesABadValue) {
  const char* env = std::getenv("TE_CPU_GEMM");
  if (env == nullptr) GTEST_SKIP() << "TE_CPU_GEMM unset (ctest sets it for this test)";
  const at::NoGradGuard no_grad;
  if (std::string(env) == "libtorch") {
    EXPECT_EQ(te::nn::cpu_gemm_library(), "libtorch");
    F::dense(at::randn({4, 8}), at::randn({8, 2}));
    EXPECT_EQ(te::nn::onednn_gemm_count(), 0);
    EXPECT_EQ(te::nn::cpu_gemm_summary().rfind("float32 CPU GEMMs without autograd: libtorch (", 0),
              0u)
        << te::nn::cpu_gemm_summary();
    return;
  }
  EXPECT_ERROR(te::nn::cpu_gemm_library(), "TE_CPU_GEMM='" + std::string(env) + "'");
  // The summary a --help prints says what is wrong instead of throwing.
  EXPECT_NE(te::nn::cpu_gemm_summary().find("TE_CPU_GEMM='" + std::string(env) + "'"),
            std::string::npos);
  EXPECT_ERROR(F::dense(at::randn({4, 8}), at::randn({8, 2})), "neither onednn nor libtorch");
}

}  // namespace
