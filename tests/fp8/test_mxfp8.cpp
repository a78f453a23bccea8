// MXFP8BlockScaling held to TE's definitions (NVIDIA/TransformerEngine
// d0067d0da6cb01811b8072a7d304f0e00344ce2b) and the OCP Microscaling Formats v1.0:
// - E8M0: float_to_e8m0 (transformer_engine/common/util/ptx_arch_spec.cuh, and the same function
//   in tests/cpp/test_common.h, TE's own test reference), exp2f and exp2f_rcp (util/ptx.cuh);
// - the cast: cast/mxfp8/quantize_mxfp8.cuh (per 32 elements along a row: amax by fmaxf, scale
//   float_to_e8m0(amax * max_norm_rcp), codes of x * exp2f_rcp(scale), satfinite RNE);
// - dequantize: cast/mxfp8/dequantize_mxfp8.cuh (code * exp2f(scale)).
// The block reference recomputes blocks and amaxes with LibTorch ops, takes each scale from the
// scalar E8M0 rule (held to TE's vectors and to its defining property first) and each code from
// the scalar cast (held bit-exact to cuda_fp8.h in te_kernels_tests).

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>

#include "../expect_error.h"
#include "block_inputs.h"
#include "te/fp8.h"

namespace te::fp8 {
namespace {

using test::awkward;
using test::bits_of;

float from_bits(uint32_t b) {
  float f = 0.0f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

TEST(Mxfp8E8M0, TransformerEngineVectors) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(e8m0_round_up(0.0f), 0x00);
  EXPECT_EQ(e8m0_round_up(nan), 0xFF);
  EXPECT_EQ(e8m0_round_up(inf), 0xFE);
  EXPECT_EQ(e8m0_round_up(1.0f), 127);
  EXPECT_EQ(e8m0_round_up(1.5f), 128);  // rounded up, not to nearest
  EXPECT_EQ(e8m0_round_up(448.0f / 448.0f), 127);
  EXPECT_EQ(e8m0_round_up(449.0f * static_cast<float>(1.0 / 448.0)), 128);
  EXPECT_EQ(e8m0_round_up(FLT_MAX), 0xFE);  // saturates at 2^127
  EXPECT_EQ(e8m0_round_up(std::ldexp(1.0f, 127)), 0xFE);
  EXPECT_EQ(e8m0_round_up(std::ldexp(1.0f, -126)), 1);
  EXPECT_EQ(e8m0_round_up(from_bits(0x00800001u)), 2);
  // Subnormals: up to 2^-127 (0x00400000) -> 0, above it -> 1.
  EXPECT_EQ(e8m0_round_up(from_bits(0x00000001u)), 0);
  EXPECT_EQ(e8m0_round_up(from_bits(0x00400000u)), 0);
  EXPECT_EQ(e8m0_round_up(from_bits(0x00400001u)), 1);

  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(bits_of(e8m0_to_float(0)), 0x00400000u);  // 2^-127
  EXPECT_EQ(e8m0_to_float(1), std::ldexp(1.0f, -126));
  EXPECT_EQ(e8m0_to_float(0xFE), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_float(0xFF)));
  EXPECT_EQ(e8m0_reciprocal(127), 1.0f);
  EXPECT_EQ(e8m0_reciprocal(0), std::ldexp(1.0f, 127));
  EXPECT_EQ(bits_of(e8m0_reciprocal(0xFE)), 0x00400000u);
  EXPECT_EQ(e8m0_reciprocal(0xFD), std::ldexp(1.0f, -126));
  EXPECT_TRUE(std::isnan(e8m0_reciprocal(0xFF)));

  // Every power of two maps to itself, the next float up to the next power; value times
  // reciprocal is exactly 1.
  for (int b = 0; b <= 0xFE; ++b) {
    const float v = e8m0_to_float(static_cast<uint8_t>(b));
    EXPECT_EQ(e8m0_round_up(v), b);
    EXPECT_EQ(e8m0_round_up(std::nextafter(v, inf)), std::min(b + 1, 0xFE)) << b;
    EXPECT_EQ(v * e8m0_reciprocal(static_cast<uint8_t>(b)), 1.0f) << b;
  }
  // The defining property on normal values: the smallest power of two at or above the value.
  at::manual_seed(1);
  const at::Tensor values = at::exp(at::randn({2000}) * 40.0).to(at::kFloat);
  for (int64_t i = 0; i < values.numel(); ++i) {
    const float v = values[i].item<float>();
    if (!(v >= std::ldexp(1.0f, -126) && v <= std::ldexp(1.0f, 127))) continue;
    const double p = e8m0_to_float(e8m0_round_up(v));
    EXPECT_TRUE(p >= v && p / 2 < v) << v;
  }
}

// TE's cast for one layout, from the definition: per 32 elements along a row (a ragged edge
// padded with zeros), the amax with NaN skipped, the E8M0 scale of amax * (1 / fp8_max), codes
// of x times the scale's reciprocal.
std::pair<at::Tensor, at::Tensor> reference_mx(const at::Tensor& x, DType dtype) {
  const int64_t rows = x.size(0), cols = x.size(1), nb = (cols + 31) / 32;
  at::Tensor padded = at::zeros({rows, nb * 32});
  padded.narrow(1, 0, cols).copy_(x);
  const at::Tensor absx = at::where(at::isnan(padded), at::zeros_like(padded), padded.abs());
  const at::Tensor amax = absx.reshape({rows, nb, 32}).amax({2}).contiguous();
  const float rcp = static_cast<float>(1.0 / max_finite(dtype));
  at::Tensor scales = at::empty({rows, nb}, at::kByte);
  at::Tensor codes = at::empty({rows, cols}, at::kByte);
  const at::Tensor xc = x.contiguous();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      scales[i][b] = e8m0_round_up(amax[i][b].item<float>() * rcp);
    }
    for (int64_t j = 0; j < cols; ++j) {
      const uint8_t e = scales[i][j / 32].item<uint8_t>();
      codes[i][j] = cast_to_fp8(xc[i][j].item<float>() * e8m0_reciprocal(e), dtype);
    }
  }
  return {codes, scales};
}

TEST(Mxfp8, CastsEqualTesDefinitionBitForBit) {
  const std::vector<std::pair<int64_t, int64_t>> shapes{{1, 1},  {3, 31},   {5, 32},
                                                        {7, 33}, {20, 300}, {64, 96}};
  for (const auto& [rows, cols] : shapes) {
    const at::Tensor x = awkward(rows, cols, 5 + rows * 1000 + cols, 32);
    for (DType dtype : {DType::kE4M3, DType::kE5M2}) {
      const Fp8Tensor q = quantize_mx(x, dtype);
      const auto [codes, scales] = reference_mx(x, dtype);
      SCOPED_TRACE(::testing::Message()
                   << rows << "x" << cols << " e5m2 " << (dtype == DType::kE5M2));
      EXPECT_EQ(q.scaling, ScalingMode::kBlock1x32);
      EXPECT_EQ(q.dtype, dtype);
      EXPECT_EQ(q.scale_inv.scalar_type(), at::kByte);
      ASSERT_EQ(q.scale_inv.sizes(), scales.sizes());
      EXPECT_TRUE(at::equal(q.scale_inv, scales));
      EXPECT_TRUE(at::equal(q.data, codes));
    }
  }
}

TEST(Mxfp8, SpecialBlocks) {
  const float inf = std::numeric_limits<float>::infinity();
  at::Tensor x = at::ones({2, 128});
  x[0].narrow(0, 0, 32).zero_();                       // zero block: scale 2^-127
  x[0][40] = std::numeric_limits<float>::quiet_NaN();  // skipped by the amax
  x[0].narrow(0, 64, 32).fill_(448.0f);                // amax 448: scale 1, exact
  x[0][96] = 449.0f;                                   // just above: scale 2
  x[1][0] = inf;                                       // inf: scale 2^127, inf saturates
  x[1][32] = 1000.0f;                                  // one outlier: 1000/448 -> 4
  x[1][64] = -3e38f;                                   // near FLT_MAX
  const Fp8Tensor q = quantize_mx(x, DType::kE4M3);
  const at::Tensor e = q.scale_inv;
  EXPECT_EQ(e[0][0].item<uint8_t>(), 0x00);
  EXPECT_EQ(q.data[0][0].item<uint8_t>(), 0x00);
  EXPECT_EQ(e[0][1].item<uint8_t>(), 127 - 8);     // amax 1 (NaN skipped): 1/448 -> 2^-8
  EXPECT_EQ(q.data[0][40].item<uint8_t>(), 0x7F);  // NaN stays NaN
  EXPECT_EQ(q.data[0][41].item<uint8_t>(), cast_to_fp8(256.0f, DType::kE4M3));
  EXPECT_EQ(e[0][2].item<uint8_t>(), 127);
  EXPECT_EQ(q.data[0][64].item<uint8_t>(), 0x7E);  // 448
  EXPECT_EQ(e[0][3].item<uint8_t>(), 128);
  EXPECT_EQ(q.data[0][96].item<uint8_t>(), cast_to_fp8(224.5f, DType::kE4M3));
  EXPECT_EQ(e[1][0].item<uint8_t>(), 0xFE);
  EXPECT_EQ(q.data[1][0].item<uint8_t>(), 0x7E);  // inf * 2^-127 saturates to 448
  EXPECT_EQ(q.data[1][1].item<uint8_t>(), 0x00);  // 1 * 2^-127 underflows
  EXPECT_EQ(e[1][1].item<uint8_t>(), 129);
  EXPECT_EQ(q.data[1][32].item<uint8_t>(), cast_to_fp8(250.0f, DType::kE4M3));
  EXPECT_EQ(q.data[1][33].item<uint8_t>(), cast_to_fp8(0.25f, DType::kE4M3));
  EXPECT_EQ(e[1][2].item<uint8_t>(), 127 + 120);  // 3e38/448 = 6.7e35 -> 2^120
  // The E5M2 gradient format divides by its own max.
  EXPECT_EQ(quantize_mx(at::full({1, 32}, 57344.0f), DType::kE5M2).scale_inv.item<uint8_t>(), 127);
}

// Each element's block scale 2^(e - 127), as fp32 [rows, cols].
at::Tensor element_scales(const Fp8Tensor& q) {
  const at::Tensor e = q.scale_inv.contiguous();
  at::Tensor scale = at::empty(e.sizes());
  for (int64_t i = 0; i < e.size(0); ++i) {
    for (int64_t b = 0; b < e.size(1); ++b) scale[i][b] = e8m0_to_float(e[i][b].item<uint8_t>());
  }
  return scale.repeat_interleave(32, 1).narrow(1, 0, q.data.size(1));
}

TEST(Mxfp8, RoundTripAndTransposedLayout) {
  const at::Tensor x = awkward(70, 200, 12, 32).clamp(-1e30, 1e30).nan_to_num(0.0);
  for (const at::Tensor& v : {x, x.t()}) {  // rowwise, and the columnwise copy (x^T's own blocks)
    const Fp8Tensor q = quantize_mx(v, DType::kE4M3);
    const at::Tensor back = q.dequantize(), s = element_scales(q);
    // dequantize = decoded codes times their block's power of two, exactly.
    const at::Tensor decoded = Fp8Tensor{q.data, at::ones({1}), DType::kE4M3}.dequantize() * s;
    EXPECT_TRUE(at::equal(back, decoded));
    // Within half an E4M3 step: 2^-4 of the value, 2^-10 of the block scale for subnormal codes.
    const at::Tensor bound = v.abs() * std::ldexp(1.0, -4) + s * std::ldexp(1.0, -10);
    EXPECT_TRUE(((back - v).abs() <= bound).all().item<bool>());
  }
  EXPECT_EQ(quantize_mx(x.t(), DType::kE4M3).scale_inv.sizes(), (std::vector<int64_t>{200, 3}));
}

TEST(Mxfp8, GemmIsTheSumOfScaledBlockProducts) {
  at::manual_seed(3);
  const int64_t m = 40, k = 100, n = 30;
  const at::Tensor x = at::randn({m, k}) * at::linspace(0.01, 100, k).to(at::kFloat);
  const at::Tensor w = at::randn({k, n});
  const Fp8Tensor a = quantize_mx(x, DType::kE4M3), b_t = quantize_mx(w.t(), DType::kE4M3);
  const at::Tensor y = gemm_nt(a, b_t);
  const at::Tensor qa = Fp8Tensor{a.data, at::ones({1}), DType::kE4M3}.dequantize().to(at::kDouble);
  const at::Tensor qb =
      Fp8Tensor{b_t.data, at::ones({1}), DType::kE4M3}.dequantize().to(at::kDouble);
  const at::Tensor sa = element_scales(a).to(at::kDouble), sb = element_scales(b_t).to(at::kDouble);
  at::Tensor ref = at::zeros({m, n}, at::kDouble), mag = at::zeros({m, n}, at::kDouble);
  for (int64_t kb = 0; kb * 32 < k; ++kb) {
    const int64_t len = std::min<int64_t>(32, k - kb * 32);
    const at::Tensor pa = qa.narrow(1, kb * 32, len), pb = qb.narrow(1, kb * 32, len);
    const at::Tensor ss = sa.select(1, kb * 32).unsqueeze(1) * sb.select(1, kb * 32).unsqueeze(0);
    ref += at::mm(pa, pb.t()) * ss;
    mag += at::mm(pa.abs(), pb.abs().t()) * ss;
  }
  // Power-of-two scales: every scaled element exact; fp32 sums of K = 100 terms.
  EXPECT_TRUE(((y.to(at::kDouble) - ref).abs() <= mag * 1e-5 + 1e-30).all().item<bool>());
  EXPECT_GT(y.abs().max().item<float>(), 1.0f);
}

TEST(Mxfp8, MisuseIsRefusedByName) {
  const at::Tensor x = at::randn({4, 256});
  EXPECT_ERROR(quantize_mx(at::randn({2, 3, 4}), DType::kE4M3), "block scaling takes a 2-D tensor");
  EXPECT_ERROR(quantize_mx(x.to(at::kInt), DType::kE4M3), "cannot cast a Int tensor to MXFP8");
  EXPECT_ERROR(quantize_blocks(x, ScalingMode::kBlock1x32, DType::kE4M3, true, 0.0f),
               "MXFP8's 1x32 blocks: quantize_mx");
  const Fp8Tensor mx = quantize_mx(x, DType::kE4M3);
  const Fp8Tensor row = quantize_blocks(x, ScalingMode::kBlock1x128, DType::kE4M3, true, 0.0f);
  EXPECT_ERROR(gemm_nt(mx, row), "a is scaled per 1x32 and b_t per 1x128");
  EXPECT_ERROR(gemm_nt(row, mx), "MXFP8's 1x32 blocks multiply only 1x32 blocks");
  EXPECT_ERROR(gemm_nt(mx, quantize_to_own_scale(x, DType::kE4M3)),
               "a per-tensor operand does not multiply a block-scaled one");
  EXPECT_ERROR(transpose_tiles(mx), "only square tiles (128x128, NVFP4's 16x16) transpose");
  Fp8Tensor bad = mx;
  bad.scale_inv = at::ones({4, 8});  // fp32, not E8M0
  EXPECT_ERROR(bad.dequantize(),
               "scale_inv [4, 8] for [4, 256] codes in 1x32 blocks; it must be "
               "E8M0 (uint8) [4, 8]");
  bad.scale_inv = at::ones({4, 2}, at::kByte);
  EXPECT_ERROR(bad.dequantize(), "scale_inv [4, 2] for [4, 256] codes in 1x32 blocks");
}

TEST(Mxfp8, RecipeByNameAndDefaults) {
  const Recipe r = recipe_named("mxfp8");
  ASSERT_TRUE(r.is<MXFP8BlockScaling>());
  EXPECT_EQ(r.get_if<MXFP8BlockScaling>()->fp8_format, Format::kE4M3);  // TE's default
  EXPECT_EQ(r.name(), "mxfp8");
  EXPECT_EQ(r.to_string(), "MXFP8BlockScaling(format=E4M3, blocks=1x32 E8M0)");
  EXPECT_EQ(Recipe{MXFP8BlockScaling{Format::kHybrid}}.to_string(),
            "MXFP8BlockScaling(format=HYBRID, blocks=1x32 E8M0)");
  EXPECT_NE(recipe_summary().find("mxfp8 (MXFP8BlockScaling: E8M0 scales per 1x32 block"),
            std::string::npos);
}

// fp8::linear under MXFP8 equals the GEMMs written from the definition: forward, dgrad and wgrad,
// each operand blocked along the dim its GEMM contracts; HYBRID's gradients in E5M2.
TEST(Mxfp8, LinearEqualsTheDefinition) {
  at::manual_seed(5);
  // Features spanning 1e-6..1e6: a row block along K mixes magnitudes (its small elements lose
  // bits), a block of x^T along the tokens does not, so the two layouts' casts differ.
  const at::Tensor x0 = at::randn({2, 45, 100}) * at::pow(10.0, at::linspace(-6, 6, 100)),
                   w0 = at::randn({100, 70}) * 0.1;
  const at::Tensor g = at::randn({2, 45, 70});
  const at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  auto meta = std::make_shared<GemmMeta>();
  at::Tensor y;
  {
    Fp8Autocast fp8(true, MXFP8BlockScaling{Format::kHybrid});
    y = linear(x, w, meta);
  }
  y.backward(g);
  auto dq = [](const at::Tensor& t, DType dtype) { return quantize_mx(t, dtype).dequantize(); };
  const at::Tensor x2 = x0.reshape({-1, 100}), g2 = g.reshape({-1, 70});
  const at::Tensor y_ref = at::mm(dq(x2, DType::kE4M3), dq(w0.t(), DType::kE4M3).t());
  EXPECT_TRUE(at::allclose(y.reshape({-1, 70}), y_ref, 1e-5, 1e-3));
  const at::Tensor gx_ref = at::mm(dq(g2, DType::kE5M2), dq(w0, DType::kE4M3).t());
  EXPECT_TRUE(at::allclose(x.grad().reshape({-1, 100}), gx_ref, 1e-5, 1e-5));
  const at::Tensor gw_ref = at::mm(dq(x2.t(), DType::kE4M3), dq(g2.t(), DType::kE5M2).t());
  EXPECT_TRUE(at::allclose(w.grad(), gw_ref, 1e-5, 1e-3));
  // The wgrad took x^T's own blocks: the transposed rowwise cast would differ.
  const at::Tensor gw_wrong = at::mm(dq(x2, DType::kE4M3).t(), dq(g2.t(), DType::kE5M2).t());
  EXPECT_FALSE(at::allclose(w.grad(), gw_wrong, 1e-5, 1e-5));
  EXPECT_FALSE(meta->fwd_amax_history.defined());  // no state kept
}

}  // namespace
}  // namespace te::fp8
