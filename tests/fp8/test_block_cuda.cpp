// The block-scaled recipes on CUDA tensors against the CPU reference: Float8BlockScaling (1x128,
// 128x128), MXFP8 (1x32) and NVFP4 (1x16, 16x16, stochastic rounding, the Hadamard transform)
// casts and their inverses bit for bit, the block GEMM within fp32 summation order, and
// fp8::linear under each recipe forward and backward. They need a CUDA LibTorch and a GPU
// (scripts/gpu-check.sh runs them); elsewhere they skip. The device checks run everywhere.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>

#include "../expect_error.h"
#include "block_inputs.h"
#include "te/fp8.h"

namespace te::fp8 {
namespace {

using test::awkward;

// A CUDA LibTorch and a GPU, and te-cpp built with its CUDA kernels (TE_WITH_CUDA).
#ifdef TE_WITH_CUDA
#define SKIP_WITHOUT_CUDA() \
  if (!at::hasCUDA()) GTEST_SKIP() << "LibTorch sees no CUDA device (or is a CPU build)"
#else
#define SKIP_WITHOUT_CUDA() GTEST_SKIP() << "te-cpp was built without its CUDA kernels"
#endif

// Equal bit for bit: floats compared as their 32-bit patterns, except that any NaN equals any
// NaN (a NaN's payload and sign are the hardware's: the CPU's default NaN is 0xFFC00000 on x86,
// the GPU's 0x7FFFFFFF, and a code decoded through half precision keeps other bits).
void expect_same_bits(const at::Tensor& got, const at::Tensor& want, const char* what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor g = got.cpu().contiguous(), w = want.contiguous();
  if (w.scalar_type() == at::kFloat) {
    const at::Tensor diff = (g.view(at::kInt) != w.view(at::kInt)) & ~(at::isnan(g) & at::isnan(w));
    const int64_t n = diff.sum().item<int64_t>();
    EXPECT_EQ(n, 0) << what << ": first at flat index "
                    << (n > 0 ? diff.flatten().nonzero()[0].item<int64_t>() : -1);
  } else {
    EXPECT_TRUE(at::equal(g, w)) << what << ": " << (g != w).sum().item<int64_t>() << " differ";
  }
}

void expect_same(const Fp8Tensor& got, const Fp8Tensor& want, const char* what) {
  EXPECT_TRUE(got.data.is_cuda()) << what;
  EXPECT_EQ(got.scaling, want.scaling) << what;
  expect_same_bits(got.data, want.data, what);
  expect_same_bits(got.scale_inv, want.scale_inv, what);
  if (want.amax.defined()) expect_same_bits(got.amax, want.amax, what);
  expect_same_bits(got.dequantize(), want.dequantize(), what);
}

Fp8Tensor on_cuda(const Fp8Tensor& t) {
  Fp8Tensor out = t;
  out.data = t.data.cuda();
  out.scale_inv = t.scale_inv.cuda();
  if (t.amax.defined()) out.amax = t.amax.cuda();
  return out;
}

TEST(BlockCuda, Float8BlockScalingCastsAreBitExact) {
  SKIP_WITHOUT_CUDA();
  // Ragged in both dims: a short last block and a short last tile.
  const at::Tensor x = awkward(300, 390, 1);
  for (ScalingMode mode : {ScalingMode::kBlock1x128, ScalingMode::kBlock128x128}) {
    for (DType dtype : {DType::kE4M3, DType::kE5M2}) {
      for (bool power_2 : {true, false}) {
        for (float epsilon : {0.0f, 1e-3f}) {
          const Fp8Tensor want = quantize_blocks(x, mode, dtype, power_2, epsilon);
          const Fp8Tensor got = quantize_blocks(x.cuda(), mode, dtype, power_2, epsilon);
          expect_same(got, want, to_string(mode));
        }
      }
    }
  }
}

TEST(BlockCuda, Mxfp8CastsAreBitExact) {
  SKIP_WITHOUT_CUDA();
  const at::Tensor x = awkward(70, 200, 2, 32);
  for (DType dtype : {DType::kE4M3, DType::kE5M2}) {
    expect_same(quantize_mx(x.cuda(), dtype), quantize_mx(x, dtype), "1x32");
  }
}

TEST(BlockCuda, Nvfp4CastsAreBitExact) {
  SKIP_WITHOUT_CUDA();
  const at::Tensor x = awkward(50, 90, 3, 16);
  for (ScalingMode mode : {ScalingMode::kBlock1x16, ScalingMode::kBlock16x16}) {
    for (std::optional<float> amax : {std::optional<float>{}, std::optional<float>{1e5f}}) {
      for (bool stochastic : {false, true}) {
        Nvfp4Cast how{mode, amax, stochastic, 17, 4};
        expect_same(quantize_nvfp4(x.cuda(), how), quantize_nvfp4(x, how),
                    stochastic ? "NVFP4 stochastic" : "NVFP4");
      }
    }
  }
  // The wgrad transform, a padded last block included.
  expect_same_bits(hadamard16(x.cuda()), hadamard16(x), "hadamard16");
}

TEST(BlockCuda, BlockGemmsEqualTheCpuReferenceUpToSummationOrder) {
  SKIP_WITHOUT_CUDA();
  at::manual_seed(4);
  const at::Tensor a = at::randn({96, 256}), b_t = at::randn({80, 256});
  const auto check = [](const Fp8Tensor& qa, const Fp8Tensor& qb, const char* what) {
    const at::Tensor want = gemm_nt(qa, qb);
    const at::Tensor got = gemm_nt(on_cuda(qa), on_cuda(qb));
    EXPECT_TRUE(got.is_cuda()) << what;
    // Both sum the same fp32 products in fp32, in different orders.
    const at::Tensor bound = at::mm(qa.dequantize().abs(), qb.dequantize().abs().t()) * 256 * 6e-8;
    EXPECT_TRUE(((got.cpu() - want).abs() <= bound).all().item<bool>()) << what;
  };
  check(quantize_blocks(a, ScalingMode::kBlock1x128, DType::kE4M3, true, 0.0f),
        quantize_blocks(b_t, ScalingMode::kBlock128x128, DType::kE4M3, true, 0.0f), "block");
  check(quantize_mx(a, DType::kE4M3), quantize_mx(b_t, DType::kE4M3), "mxfp8");
  check(quantize_nvfp4(a, {}), quantize_nvfp4(b_t, {ScalingMode::kBlock16x16}), "nvfp4");
}

// fp8::linear under each block recipe on CUDA tensors: forward, dgrad and wgrad as on the CPU
// (NVFP4's stochastic gradient draws are the same words on both).
TEST(BlockCuda, LinearUnderEveryBlockRecipeEqualsTheCpu) {
  SKIP_WITHOUT_CUDA();
  at::manual_seed(6);
  const at::Tensor x0 = at::randn({4, 32, 256}), w0 = at::randn({256, 128}) * 0.1;
  const at::Tensor g = at::randn({4, 32, 128});
  // A fresh recipe for each pass: NVFP4's counts its stochastic draws, so both passes start at
  // the same call.
  const std::function<Recipe()> recipes[] = {[] { return Recipe{Float8BlockScaling{}}; },
                                             [] { return Recipe{MXFP8BlockScaling{}}; },
                                             [] { return Recipe{NVFP4BlockScaling{}}; }};
  for (const auto& make : recipes) {
    at::Tensor y[2], gx[2], gw[2];
    for (int on_gpu = 0; on_gpu < 2; ++on_gpu) {
      const at::Device device = on_gpu ? at::Device(at::kCUDA) : at::Device(at::kCPU);
      // detach: on the CPU to() returns x0 / w0 themselves, which must stay without grad.
      const at::Tensor x = x0.to(device).detach().requires_grad_(),
                       w = w0.to(device).detach().requires_grad_();
      auto meta = std::make_shared<GemmMeta>();
      {
        Fp8Autocast fp8(true, make());
        y[on_gpu] = linear(x, w, meta);
      }
      y[on_gpu].backward(g.to(device));
      y[on_gpu] = y[on_gpu].cpu();
      gx[on_gpu] = x.grad().cpu();
      gw[on_gpu] = w.grad().cpu();
    }
    const std::string name = make().to_string();
    EXPECT_TRUE(at::allclose(y[1], y[0], 1e-4, 1e-4)) << name;
    EXPECT_TRUE(at::allclose(gx[1], gx[0], 1e-4, 1e-4)) << name;
    EXPECT_TRUE(at::allclose(gw[1], gw[0], 1e-4, 1e-4)) << name;
  }
}

// Scales on another device than their codes would reach a kernel as the wrong kind of pointer:
// refused by name, on any build (the meta device stands in for the other device).
TEST(BlockCuda, ScalesAwayFromTheirCodesAreRefused) {
  const at::Tensor x = at::randn({4, 64});
  Fp8Tensor block = quantize_blocks(x, ScalingMode::kBlock1x128, DType::kE4M3, true, 0.0f);
  block.scale_inv = at::empty(block.scale_inv.sizes(), block.scale_inv.options().device(at::kMeta));
  EXPECT_ERROR(block.dequantize(),
               "fp8::dequantize: scale_inv is on meta but the codes on cpu; keep the scales");
  Fp8Tensor nv = quantize_nvfp4(x, {});
  nv.amax = at::empty({1}, nv.amax.options().device(at::kMeta));
  EXPECT_ERROR(nv.dequantize(),
               "fp8::dequantize: NVFP4 codes on cpu with scale_inv on cpu and "
               "amax on meta; keep the scales");
}

}  // namespace
}  // namespace te::fp8
