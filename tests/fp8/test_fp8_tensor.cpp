// FP8 tensors on CPU: quantize/dequantize/cast_transpose agree with the scalar casts, amax is
// exact, the reference GEMM equals exact products summed, and bad input is refused.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <cmath>

#include "../expect_error.h"
#include "../kernels/float_bits.h"
#include "te/fp8.h"

namespace te::fp8 {
namespace {

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randn(shape, g);
}

TEST(Fp8Tensor, QuantizeIsTheScalarCastOfScaledValuesAndFoldsAmax) {
  const at::Tensor x = randn({300, 70}, 1) * 30;  // more than one parallel chunk
  const at::Tensor scale = at::full({1}, 2.5f);
  at::Tensor amax = at::full({1}, 1.0f);
  for (DType t : {DType::kE4M3, DType::kE5M2}) {
    const Fp8Tensor q = quantize(x, scale, t, amax);
    ASSERT_EQ(q.data.scalar_type(), at::kByte);
    ASSERT_EQ(q.data.sizes(), x.sizes());
    EXPECT_EQ(q.scale_inv.item<float>(), 1.0f / 2.5f);
    const float* xs = x.data_ptr<float>();
    const uint8_t* cs = q.data.data_ptr<uint8_t>();
    int bad = 0;
    for (int64_t i = 0; i < x.numel(); ++i) bad += cs[i] != cast_to_fp8(xs[i] * 2.5f, t);
    EXPECT_EQ(bad, 0);
    const at::Tensor back = q.dequantize();
    for (int64_t i = 0; i < 50; ++i) {
      EXPECT_EQ(back.view(-1)[i].item<float>(), cast_from_fp8(cs[i], t) * (1.0f / 2.5f));
    }
  }
  EXPECT_EQ(amax.item<float>(), x.abs().max().item<float>());
  // An amax already larger stays.
  at::Tensor big = at::full({1}, 1e6f);
  quantize(x, scale, DType::kE4M3, big);
  EXPECT_EQ(big.item<float>(), 1e6f);
  EXPECT_EQ(fp8::amax(x).item<float>(), x.abs().max().item<float>());
  at::Tensor with_nan = x.clone();
  with_nan[3][4] = NAN;
  EXPECT_TRUE(std::isnan(fp8::amax(with_nan).item<float>()));
}

TEST(Fp8Tensor, CastTransposeGivesBothLayoutsOfTheSameCodes) {
  const at::Tensor x = randn({37, 53}, 2) * 4;
  at::Tensor amax = at::zeros({1});
  const auto [a, t] = cast_transpose(x, at::full({1}, 8.0f), DType::kE4M3, amax);
  EXPECT_TRUE(at::equal(t.data, a.data.t().contiguous()));
  EXPECT_TRUE(t.data.is_contiguous());
  EXPECT_TRUE(at::equal(a.data, quantize(x, at::full({1}, 8.0f), DType::kE4M3).data));
  EXPECT_EQ(amax.item<float>(), x.abs().max().item<float>());
  EXPECT_ERROR(cast_transpose(x.view(-1), at::ones({1}), DType::kE4M3),
               "x has shape [1961]; it takes a 2-D tensor");
}

TEST(Fp8Tensor, ReferenceGemmIsExactProductsSummedInFp32AndScaled) {
  const at::Tensor a_val = randn({9, 40}, 3), b_val = randn({40, 11}, 4);
  const Fp8Tensor a = quantize(a_val, at::full({1}, 16.0f), DType::kE4M3);
  const Fp8Tensor b = quantize(b_val, at::full({1}, 64.0f), DType::kE5M2);
  const at::Tensor d = gemm(a, b);
  // In double: the same products (exact in fp32 too) summed, then the two scale_invs.
  const at::Tensor da = Fp8Tensor{a.data, at::ones({1}), a.dtype}.dequantize().to(at::kDouble);
  const at::Tensor db = Fp8Tensor{b.data, at::ones({1}), b.dtype}.dequantize().to(at::kDouble);
  const at::Tensor want = at::mm(da, db) / 16.0 / 64.0;
  EXPECT_LE((d.to(at::kDouble) - want).abs().max().item<double>(),
            1e-6 * want.abs().max().item<double>());
  // And close to the fp32 product of the originals, within E4M3/E5M2 rounding.
  const at::Tensor exact = at::mm(a_val, b_val);
  const double bound = (0.0625 + 0.125 + 0.0625 * 0.125) *
                       at::mm(a_val.abs(), b_val.abs()).max().item<double>() * 1.01;
  EXPECT_LE((d - exact).abs().max().item<double>(), bound);
}

TEST(Fp8Tensor, QuantizeRowsCastsEachRowWithItsOwnScale) {
  at::Tensor x = randn({5, 7}, 11);
  x[1].mul_(1000);   // rows far apart in range
  x[2].zero_();      // an all-zero row keeps scale 1
  x[3][4] = 1e-30f;  // a row of one tiny value and zeros
  x[3].narrow(0, 0, 4).zero_();
  x[3].narrow(0, 5, 2).zero_();
  const auto [codes, scale_inv] = quantize_rows(x, DType::kE4M3);
  ASSERT_EQ(codes.sizes(), x.sizes());
  ASSERT_EQ(scale_inv.sizes(), at::IntArrayRef({5}));
  for (int64_t r = 0; r < 5; ++r) {
    const Fp8Tensor own = r == 2 ? quantize(x[r], at::ones({1}), DType::kE4M3)
                                 : quantize_to_own_scale(x[r], DType::kE4M3);
    EXPECT_TRUE(at::equal(codes[r], own.data)) << "row " << r;
    EXPECT_FLOAT_EQ(scale_inv[r].item<float>(), own.scale_inv.item<float>()) << "row " << r;
  }
  EXPECT_FLOAT_EQ(scale_inv[2].item<float>(), 1.0f);
  // Decoding after a lookup of rows: each row by its own scale, within E4M3's half-ulp.
  const at::Tensor rows = at::tensor({1, 1, 4, 0}, at::kLong);
  const at::Tensor got =
      dequantize_rows(codes.index_select(0, rows), scale_inv.index_select(0, rows), DType::kE4M3);
  const at::Tensor want = x.index_select(0, rows);
  EXPECT_TRUE(at::allclose(got, want, /*rtol=*/0.0625, /*atol=*/1e-6));
  EXPECT_FALSE(at::equal(got, want));
  EXPECT_ERROR(quantize_rows(at::ones({3}), DType::kE4M3), "it takes a 2-D tensor [rows, cols]");
  EXPECT_ERROR(dequantize_rows(codes, at::ones({4}), DType::kE4M3),
               "codes [5, 7] and scale_inv [4] do not match; give one scale per row");
}

TEST(Fp8Tensor, BadInputIsRefusedWithTheReason) {
  const Fp8Tensor a = quantize(randn({4, 8}, 5), at::ones({1}), DType::kE5M2);
  const Fp8Tensor b = quantize(randn({8, 3}, 6), at::ones({1}), DType::kE5M2);
  try {
    gemm(a, b);
    FAIL() << "E5M2 x E5M2 accepted";
  } catch (const te::Error& e) {
    EXPECT_NE(std::string(e.what()).find("both operands are E5M2"), std::string::npos);
  }
  const Fp8Tensor c = quantize(randn({4, 8}, 7), at::ones({1}), DType::kE4M3);
  try {
    gemm(c, c);
    FAIL() << "[4, 8] x [4, 8] accepted";
  } catch (const te::Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not multiply"), std::string::npos);
  }
  EXPECT_ERROR(quantize(at::ones({3}, at::kLong), at::ones({1}), DType::kE4M3),
               "cannot cast a Long tensor to FP8");
  EXPECT_ERROR(quantize(at::ones({3}), at::ones({2}), DType::kE4M3),
               "scale must be an fp32 tensor of one element");
  EXPECT_ERROR(quantize(at::ones({3}), at::ones({1}, at::kDouble), DType::kE4M3),
               "scale must be an fp32 tensor of one element");
  // A scale_inv that is not with its codes (on a GPU the kernels would read it as a device
  // pointer): named, whichever op reads it. The meta device stands in for another device here.
  Fp8Tensor away = c;
  away.scale_inv = at::empty({1}, at::TensorOptions().device(at::kMeta).dtype(at::kFloat));
  EXPECT_ERROR(away.dequantize(),
               "Fp8Tensor::dequantize: scale_inv is on meta but the data on cpu");
  const Fp8Tensor ct{c.data.t().contiguous(), c.scale_inv, c.dtype};
  EXPECT_ERROR(gemm(away, ct), "gemm: a.scale_inv is on meta but the data on cpu");
  EXPECT_ERROR(gemm(c, Fp8Tensor{ct.data, at::ones({1}, at::kDouble), ct.dtype}),
               "gemm: b.scale_inv must be an fp32 tensor of one element");
}

TEST(Fp8Tensor, CudaTensorsMatchTheCpuReference) {
  if (!at::hasCUDA()) GTEST_SKIP() << "LibTorch sees no CUDA device (or is a CPU build)";
  const at::Tensor x = randn({128, 96}, 20) * 5;
  const at::Tensor scale = at::full({1}, 4.0f);
  at::Tensor amax_cpu = at::zeros({1}), amax_gpu = at::zeros({1}, at::kCUDA);
  const auto [a_cpu, t_cpu] = cast_transpose(x, scale, DType::kE4M3, amax_cpu);
  const auto [a_gpu, t_gpu] = cast_transpose(x.cuda(), scale.cuda(), DType::kE4M3, amax_gpu);
  EXPECT_TRUE(at::equal(a_gpu.data.cpu(), a_cpu.data));
  EXPECT_TRUE(at::equal(t_gpu.data.cpu(), t_cpu.data));
  EXPECT_EQ(amax_gpu.item<float>(), amax_cpu.item<float>());
  EXPECT_TRUE(at::equal(a_gpu.dequantize().cpu(), a_cpu.dequantize()));
  const Fp8Tensor b_cpu = quantize(randn({96, 48}, 21), at::full({1}, 8.0f), DType::kE5M2);
  const Fp8Tensor b_gpu{b_cpu.data.cuda(), b_cpu.scale_inv.cuda(), DType::kE5M2};
  const at::Tensor d_cpu = gemm(a_cpu, b_cpu);
  // Tensor cores sum in a narrower accumulator, in another order (fp8_tensor_core_gemm_bound);
  // the CPU reference sums exact products in fp32 (k * 2^-24 of the sum of |products| more).
  const at::Tensor abs_sum = at::mm(a_cpu.dequantize().abs(), b_cpu.dequantize().abs());
  const double per_unit = test::fp8_tensor_core_gemm_bound(96, 1.0) + 96 * std::ldexp(1.0, -24);
  EXPECT_TRUE(((gemm(a_gpu, b_gpu).cpu() - d_cpu).abs() <= abs_sum * per_unit).all().item<bool>());
  // bf16 and fp16 tensors are cast as they are (the codes of their exact values), and a bf16 D
  // comes from the GEMM itself: within the same bound and one bf16 rounding of the CPU's.
  for (at::ScalarType low : {at::kBFloat16, at::kHalf}) {
    const at::Tensor xl = x.to(low);
    at::Tensor amax_low = at::zeros({1}, at::kCUDA);
    const auto [al_gpu, tl_gpu] = cast_transpose(xl.cuda(), scale.cuda(), DType::kE4M3, amax_low);
    const auto [al_cpu, tl_cpu] = cast_transpose(xl.to(at::kFloat), scale, DType::kE4M3);
    EXPECT_TRUE(at::equal(al_gpu.data.cpu(), al_cpu.data)) << low;
    EXPECT_TRUE(at::equal(tl_gpu.data.cpu(), tl_cpu.data)) << low;
    EXPECT_EQ(amax_low.item<float>(), xl.to(at::kFloat).abs().max().item<float>()) << low;
    EXPECT_TRUE(at::equal(quantize(xl.cuda(), scale.cuda(), DType::kE4M3).data.cpu(), al_cpu.data))
        << low;
    const at::Tensor d_low = gemm(a_gpu, b_gpu, false, low);
    EXPECT_EQ(d_low.scalar_type(), low);
    const double rounding = low == at::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    EXPECT_TRUE(
        ((d_low.cpu().to(at::kFloat) - d_cpu).abs() <= abs_sum * per_unit + d_cpu.abs() * rounding)
            .all()
            .item<bool>())
        << low;
  }
}

#if TE_HAS_FLOAT8
TEST(Fp8Tensor, ConvertsToAndFromLibTorchFloat8) {
  const Fp8Tensor q = quantize(randn({5, 6}, 8), at::full({1}, 4.0f), DType::kE4M3);
  const at::Tensor f8 = to_torch_float8(q);
  EXPECT_EQ(f8.scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_TRUE(at::equal(f8.to(at::kFloat) * q.scale_inv, q.dequantize()));
  const Fp8Tensor back = from_torch_float8(f8, q.scale_inv);
  EXPECT_TRUE(at::equal(back.data, q.data));
  EXPECT_EQ(back.dtype, DType::kE4M3);
}
#endif

}  // namespace
}  // namespace te::fp8
