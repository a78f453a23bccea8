// Float8BlockScaling and the scale rule it shares with CurrentScaling, held to TE's definitions
// (NVIDIA/TransformerEngine d0067d0da6cb01811b8072a7d304f0e00344ce2b):
// - the scale: compute_scale_from_amax in transformer_engine/common/recipe/recipe_common.cuh;
// - the blocks: tests/pytorch/references/blockwise_quantizer_reference.py (zero padding at a ragged
//   edge, per-block amax, codes of x * scale clamped to the format's max), with the kernels' amax
//   (fmaxf, so NaN is skipped) from transpose/quantize_transpose_{vector,square}_blockwise.cu.
// The block references recompute the padding, blocks and amaxes with LibTorch ops and take each
// block's scale from the scalar rule (held to TE's vectors first) and its codes from the scalar
// cast (held bit-exact to cuda_fp8.h in te_kernels_tests). Where TE's Python reference and its
// kernel differ (an infinite amax: scale 0 there, 1 in the kernel), the kernel is followed.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "../cpu_autocast.h"
#include "../expect_error.h"
#include "block_inputs.h"
#include "te/fp8.h"

namespace te::fp8 {
namespace {

using test::awkward;
using test::bits_of;

TEST(Fp8ScaleFromAmax, TransformerEngineVectors) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(scale_from_amax(448.0f, 448.0f, false, 0.0f), 1.0f);
  EXPECT_EQ(scale_from_amax(1.0f, 448.0f, false, 0.0f), 448.0f);
  EXPECT_EQ(scale_from_amax(1.0f, 448.0f, true, 0.0f), 256.0f);  // mantissa cleared
  EXPECT_EQ(scale_from_amax(3.0f, 57344.0f, false, 0.0f), 57344.0f / 3.0f);
  EXPECT_EQ(scale_from_amax(3.0f, 57344.0f, true, 0.0f), 16384.0f);  // 19114.67 -> 2^14
  EXPECT_EQ(scale_from_amax(0.0f, 448.0f, true, 0.0f), 1.0f);
  EXPECT_EQ(scale_from_amax(inf, 448.0f, false, 0.0f), 1.0f);
  EXPECT_EQ(scale_from_amax(nan, 448.0f, true, 0.0f), 1.0f);
  // fp8_max / amax overflows fp32: FLT_MAX (TE's value_for_inf for fp32 input), 2^127 as a power.
  EXPECT_EQ(scale_from_amax(1e-37f, 448.0f, false, 0.0f), FLT_MAX);
  EXPECT_EQ(scale_from_amax(1e-37f, 448.0f, true, 0.0f), std::ldexp(1.0f, 127));
  // Small amaxes whose quotient fits keep it; a subnormal one overflows.
  EXPECT_EQ(scale_from_amax(1e-30f, 448.0f, false, 0.0f), 448.0f / 1e-30f);
  EXPECT_EQ(scale_from_amax(7e-45f, 448.0f, false, 0.0f), FLT_MAX);
  // The epsilon floors the amax, zero included.
  EXPECT_EQ(scale_from_amax(1e-3f, 448.0f, false, 1.0f), 448.0f);
  EXPECT_EQ(scale_from_amax(0.0f, 448.0f, true, 0.5f), 512.0f);  // 896 -> 512
  EXPECT_EQ(scale_from_amax(2.0f, 448.0f, false, 1.0f), 224.0f);

  // The tensor form is the same rule, bit for bit.
  const std::vector<float> amaxes{448.0f, 1.0f, 3.0f,   0.0f,     inf,   nan,     1e-37f, 1e-30f,
                                  1e-3f,  2.0f, 7e-45f, 65504.0f, 1e38f, FLT_MAX, 0.75f};
  const at::Tensor t = at::tensor(amaxes);
  for (bool power_2 : {false, true}) {
    for (float eps : {0.0f, 1e-3f, 1.0f}) {
      for (float fp8_max : {448.0f, 57344.0f}) {
        const at::Tensor s = scales_from_amax(t, fp8_max, power_2, eps);
        for (std::size_t i = 0; i < amaxes.size(); ++i) {
          EXPECT_EQ(bits_of(s[i].item<float>()),
                    bits_of(scale_from_amax(amaxes[i], fp8_max, power_2, eps)))
              << "amax " << amaxes[i] << " power_2 " << power_2 << " eps " << eps;
        }
      }
    }
  }
}

// TE's reference quantizer, for one layout: x [R, C] padded with zeros to whole blocks, each
// block's amax (NaN skipped), scale by the rule, codes by the scalar cast.
struct Reference {
  at::Tensor codes;      // uint8 [R, C]
  at::Tensor scale_inv;  // [R, nb] or [nbr, nb]
};

Reference reference_blocks(const at::Tensor& x, bool tiles, DType dtype, bool power_2, float eps) {
  const int64_t rows = x.size(0), cols = x.size(1);
  const int64_t nb = (cols + 127) / 128, nbr = tiles ? (rows + 127) / 128 : rows;
  const int64_t prow = tiles ? nbr * 128 : rows;
  at::Tensor padded = at::zeros({prow, nb * 128});
  padded.narrow(0, 0, rows).narrow(1, 0, cols).copy_(x);
  const at::Tensor absx = at::where(at::isnan(padded), at::zeros_like(padded), padded.abs());
  const at::Tensor amax = tiles ? absx.reshape({nbr, 128, nb, 128}).amax({1, 3})
                                : absx.reshape({nbr, nb, 128}).amax({2});
  Reference r;
  r.scale_inv = at::empty({nbr, nb});
  at::Tensor scale = at::empty({nbr, nb});
  for (int64_t i = 0; i < nbr; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float s = scale_from_amax(amax[i][b].item<float>(), max_finite(dtype), power_2, eps);
      scale[i][b] = s;
      r.scale_inv[i][b] = 1.0f / s;
    }
  }
  r.codes = at::empty({rows, cols}, at::kByte);
  const at::Tensor xc = x.contiguous();
  const float* in = xc.data_ptr<float>();
  uint8_t* out = r.codes.data_ptr<uint8_t>();
  const float* sc = scale.contiguous().data_ptr<float>();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const float s = sc[(tiles ? i / 128 : i) * nb + j / 128];
      out[i * cols + j] = cast_to_fp8(in[i * cols + j] * s, dtype);
    }
  }
  return r;
}

TEST(Fp8BlockScaling, CastsEqualTesReferenceBitForBit) {
  const std::vector<std::pair<int64_t, int64_t>> shapes{{1, 1},   {3, 127},   {5, 128},
                                                        {7, 129}, {130, 300}, {256, 256}};
  for (const auto& [rows, cols] : shapes) {
    const at::Tensor x = awkward(rows, cols, 7 + rows * 1000 + cols);
    for (bool tiles : {false, true}) {
      for (DType dtype : {DType::kE4M3, DType::kE5M2}) {
        for (bool power_2 : {true, false}) {
          for (float eps : {0.0f, 1e-3f}) {
            const ScalingMode mode = tiles ? ScalingMode::kBlock128x128 : ScalingMode::kBlock1x128;
            const Fp8Tensor q = quantize_blocks(x, mode, dtype, power_2, eps);
            const Reference r = reference_blocks(x, tiles, dtype, power_2, eps);
            SCOPED_TRACE(::testing::Message()
                         << rows << "x" << cols << " " << to_string(mode) << " e5m2 "
                         << (dtype == DType::kE5M2) << " pow2 " << power_2 << " eps " << eps);
            EXPECT_EQ(q.scaling, mode);
            ASSERT_EQ(q.scale_inv.sizes(), r.scale_inv.sizes());
            EXPECT_TRUE(at::equal(q.data, r.codes));
            // Bitwise, NaN-free: every scale is finite.
            EXPECT_TRUE(at::equal(q.scale_inv.view(at::kInt), r.scale_inv.view(at::kInt)));
          }
        }
      }
    }
  }
}

TEST(Fp8BlockScaling, SpecialBlocks) {
  at::Tensor x = at::ones({2, 256});
  x[0].narrow(0, 0, 128).zero_();                       // zero block
  x[0][200] = std::numeric_limits<float>::quiet_NaN();  // NaN skipped by amax
  x[1][0] = std::numeric_limits<float>::infinity();     // inf amax: scale 1
  x[1][130] = 1000.0f;                                  // saturates? no: own scale
  const Fp8Tensor q = quantize_blocks(x, ScalingMode::kBlock1x128, DType::kE4M3, true, 0.0f);
  EXPECT_EQ(q.scale_inv[0][0].item<float>(), 1.0f);        // amax 0 -> scale 1
  EXPECT_EQ(q.scale_inv[0][1].item<float>(), 1.0f / 256);  // amax 1 (NaN skipped) -> 448 -> 256
  EXPECT_EQ(q.data[0][200].item<uint8_t>(), 0x7F);         // the NaN stays NaN
  EXPECT_EQ(q.data[0][201].item<uint8_t>(), cast_to_fp8(256.0f, DType::kE4M3));
  EXPECT_EQ(q.scale_inv[1][0].item<float>(), 1.0f);  // inf amax -> scale 1
  EXPECT_EQ(q.data[1][0].item<uint8_t>(), 0x7E);     // inf saturates to 448
  EXPECT_EQ(q.scale_inv[1][1].item<float>(), 4.0f);  // 448/1000 -> 0.25
  EXPECT_EQ(q.data[1][130].item<uint8_t>(), cast_to_fp8(250.0f, DType::kE4M3));
}

TEST(Fp8BlockScaling, TilesTransposeAndRoundTrip) {
  const at::Tensor x = awkward(300, 200, 11).clamp(-1e30, 1e30).nan_to_num(0.0);
  const Fp8Tensor q = quantize_blocks(x, ScalingMode::kBlock128x128, DType::kE4M3, true, 0.0f);
  const Fp8Tensor qt = transpose_tiles(q);
  const Fp8Tensor direct =
      quantize_blocks(x.t(), ScalingMode::kBlock128x128, DType::kE4M3, true, 0.0f);
  EXPECT_TRUE(at::equal(qt.data, direct.data));
  EXPECT_TRUE(at::equal(qt.scale_inv, direct.scale_inv));
  EXPECT_TRUE(at::equal(qt.dequantize(), q.dequantize().t()));

  // Round trip: every element within half an E4M3 step of its block's scale (3 mantissa bits:
  // 2^-4 relative to the value, and 2^-10 of the block's scale_inv for subnormal codes).
  for (ScalingMode mode : {ScalingMode::kBlock1x128, ScalingMode::kBlock128x128}) {
    const Fp8Tensor b = quantize_blocks(x, mode, DType::kE4M3, false, 0.0f);
    const at::Tensor back = b.dequantize();
    const at::Tensor per_elem = mode == ScalingMode::kBlock1x128
                                    ? b.scale_inv.repeat_interleave(128, 1).narrow(1, 0, 200)
                                    : b.scale_inv.repeat_interleave(128, 0)
                                          .repeat_interleave(128, 1)
                                          .narrow(0, 0, 300)
                                          .narrow(1, 0, 200);
    const at::Tensor bound = x.abs() * std::ldexp(1.0, -4) + per_elem * std::ldexp(1.0, -10);
    EXPECT_TRUE(((back - x).abs() <= bound).all().item<bool>()) << to_string(mode);
    // dequantize = decoded codes times their block's scale_inv, exactly.
    const at::Tensor decoded =
        Fp8Tensor{b.data, at::ones({1}), DType::kE4M3}.dequantize() * per_elem;
    EXPECT_TRUE(at::equal(back, decoded)) << to_string(mode);
  }
}

TEST(Fp8BlockScaling, GemmIsTheSumOfScaledBlockProducts) {
  at::manual_seed(3);
  const int64_t m = 70, k = 300, n = 130;
  const at::Tensor x = at::randn({m, k}) * at::linspace(0.01, 100, k).to(at::kFloat);
  const at::Tensor w = at::randn({k, n});
  const Fp8Tensor a = quantize_blocks(x, ScalingMode::kBlock1x128, DType::kE4M3, false, 0.0f);
  const Fp8Tensor b_t =
      quantize_blocks(w.t(), ScalingMode::kBlock128x128, DType::kE4M3, false, 0.0f);
  const at::Tensor y = gemm_nt(a, b_t);
  // y[i, j] = sum over K-blocks of sa[i, kb] sb[j/128, kb] sum_k qa[i, k] qb[j, k], in fp64.
  const at::Tensor qa = Fp8Tensor{a.data, at::ones({1}), DType::kE4M3}.dequantize().to(at::kDouble);
  const at::Tensor qb =
      Fp8Tensor{b_t.data, at::ones({1}), DType::kE4M3}.dequantize().to(at::kDouble);
  at::Tensor ref = at::zeros({m, n}, at::kDouble), mag = at::zeros({m, n}, at::kDouble);
  for (int64_t kb = 0; kb * 128 < k; ++kb) {
    const int64_t len = std::min<int64_t>(128, k - kb * 128);
    const at::Tensor sa = a.scale_inv.select(1, kb).to(at::kDouble).unsqueeze(1);
    const at::Tensor sb = b_t.scale_inv.select(1, kb)
                              .repeat_interleave(128)
                              .narrow(0, 0, n)
                              .to(at::kDouble)
                              .unsqueeze(0);
    const at::Tensor pa = qa.narrow(1, kb * 128, len), pb = qb.narrow(1, kb * 128, len);
    ref += at::mm(pa, pb.t()) * sa * sb;
    mag += at::mm(pa.abs(), pb.abs().t()) * sa * sb;
  }
  // fp32 rounding of each scaled element and of the sums: a few ulps of the magnitudes.
  // K = 300 fp32 sums: within K * 2^-24 of the magnitudes, far below any wrong scale's error.
  EXPECT_TRUE(((y.to(at::kDouble) - ref).abs() <= mag * 3e-5 + 1e-30).all().item<bool>());
  EXPECT_GT(y.abs().max().item<float>(), 1.0f);
}

TEST(Fp8BlockScaling, MisuseIsRefusedByName) {
  const at::Tensor x = at::randn({4, 256});
  EXPECT_ERROR(
      quantize_blocks(at::randn({2, 3, 4}), ScalingMode::kBlock1x128, DType::kE4M3, true, 0.0f),
      "block scaling takes a 2-D tensor");
  EXPECT_ERROR(quantize_blocks(x, ScalingMode::kTensor, DType::kE4M3, true, 0.0f),
               "scaling mode 'tensor' is not a block mode");
  EXPECT_ERROR(quantize_blocks(x.to(at::kInt), ScalingMode::kBlock1x128, DType::kE4M3, true, 0.0f),
               "cannot cast a Int tensor");
  const Fp8Tensor row = quantize_blocks(x, ScalingMode::kBlock1x128, DType::kE4M3, true, 0.0f);
  const Fp8Tensor tile = quantize_blocks(x, ScalingMode::kBlock128x128, DType::kE4M3, true, 0.0f);
  EXPECT_ERROR(gemm_nt(tile, tile), "both operands in 128x128 tiles");
  EXPECT_ERROR(
      gemm(row, Fp8Tensor{row.data.t(), row.scale_inv, DType::kE4M3, ScalingMode::kBlock1x128}),
      "call gemm_nt");
  EXPECT_ERROR(gemm_nt(row, quantize_to_own_scale(x, DType::kE4M3)),
               "a per-tensor operand does not multiply a block-scaled one");
  EXPECT_ERROR(transpose_tiles(row), "only square tiles (128x128, NVFP4's 16x16) transpose");
  Fp8Tensor bad = row;
  bad.scale_inv = at::ones({4, 3});
  EXPECT_ERROR(bad.dequantize(), "scale_inv [4, 3] for [4, 256] codes in 1x128 blocks");
}

TEST(Fp8BlockScaling, RecipeByNameAndSettings) {
  const Recipe r = recipe_named("block");
  ASSERT_TRUE(r.is<Float8BlockScaling>());
  EXPECT_EQ(r.get_if<Float8BlockScaling>()->fp8_format, Format::kE4M3);  // TE's default
  EXPECT_TRUE(r.get_if<Float8BlockScaling>()->power_2_scales);
  EXPECT_EQ(r.name(), "block");
  EXPECT_EQ(r.to_string(),
            "Float8BlockScaling(format=E4M3, power_2_scales=true, amax_epsilon=0, x=1x128, "
            "w=128x128, grad=1x128)");
  EXPECT_EQ(recipe_names(),
            (std::vector<std::string>{"delayed", "current", "block", "mxfp8", "nvfp4"}));
  EXPECT_ERROR(recipe_named("mxfp4"),
               "FP8 recipe 'mxfp4' is not one of: delayed, current, block, mxfp8, nvfp4");
  Float8BlockScaling bad;
  bad.amax_epsilon = -1.0f;
  EXPECT_ERROR(Recipe{bad}, "Float8BlockScaling: amax_epsilon is -1");
  CurrentScaling current;
  current.amax_epsilon = std::numeric_limits<float>::quiet_NaN();
  EXPECT_ERROR(Recipe{current}, "CurrentScaling: amax_epsilon is nan");
  current = CurrentScaling{Format::kE4M3, true, 0.5f};
  EXPECT_EQ(Recipe{current}.to_string(),
            "CurrentScaling(format=E4M3, use_power_2_scales=true, amax_epsilon=0.5)");
}

// fp8::linear under each per-block / per-tensor-with-options recipe equals the GEMMs written from
// the definitions: forward, dgrad and wgrad.
TEST(Fp8BlockScaling, LinearEqualsTheDefinition) {
  at::manual_seed(5);
  const at::Tensor x0 = at::randn({2, 90, 260}) * 3, w0 = at::randn({260, 140}) * 0.1;
  const at::Tensor g = at::randn({2, 90, 140});
  const at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  auto meta = std::make_shared<GemmMeta>();
  at::Tensor y;
  {
    Fp8Autocast fp8(true, Float8BlockScaling{Format::kHybrid, true, 0.0f});
    y = linear(x, w, meta);
  }
  y.backward(g);
  auto dq = [](const at::Tensor& t, ScalingMode mode, DType dtype) {
    return quantize_blocks(t, mode, dtype, true, 0.0f).dequantize();
  };
  const at::Tensor x2 = x0.reshape({-1, 260}), g2 = g.reshape({-1, 140});
  const at::Tensor w_t = dq(w0.t(), ScalingMode::kBlock128x128, DType::kE4M3);  // [N, K]
  const at::Tensor y_ref = at::mm(dq(x2, ScalingMode::kBlock1x128, DType::kE4M3), w_t.t());
  EXPECT_TRUE(at::allclose(y.reshape({-1, 140}), y_ref, 1e-5, 1e-5));
  const at::Tensor gx_ref = at::mm(dq(g2, ScalingMode::kBlock1x128, DType::kE5M2), w_t);
  EXPECT_TRUE(at::allclose(x.grad().reshape({-1, 260}), gx_ref, 1e-5, 1e-5));
  const at::Tensor gw_ref = at::mm(dq(x2.t(), ScalingMode::kBlock1x128, DType::kE4M3),
                                   dq(g2.t(), ScalingMode::kBlock1x128, DType::kE5M2).t());
  EXPECT_TRUE(at::allclose(w.grad(), gw_ref, 1e-5, 1e-5));
  // No state kept: the block recipe touched none of the GEMM's scales or histories.
  EXPECT_FALSE(meta->fwd_amax_history.defined());
}

TEST(Fp8CurrentScaling, PowerOfTwoScalesAndEpsilonReachTheCast) {
  at::manual_seed(9);
  const at::Tensor x = at::randn({16, 64}) * 1e-4, w = at::randn({64, 32});
  auto meta = std::make_shared<GemmMeta>();
  for (float eps : {0.0f, 1.0f}) {
    at::Tensor y;
    {
      Fp8Autocast fp8(true, CurrentScaling{Format::kHybrid, true, eps});
      y = linear(x, w, meta);
    }
    const float sx = scale_from_amax(x.abs().max().item<float>(), 448.0f, true, eps);
    const float sw = scale_from_amax(w.abs().max().item<float>(), 448.0f, true, eps);
    EXPECT_EQ(sx, eps > 0 ? 256.0f
                          : std::exp2(std::floor(std::log2(448.0f / x.abs().max().item<float>()))));
    const Fp8Tensor qx = quantize(x, at::full({1}, sx), DType::kE4M3);
    const Fp8Tensor qw = quantize(w, at::full({1}, sw), DType::kE4M3);
    EXPECT_TRUE(at::allclose(y, gemm(qx, qw), 1e-5, 1e-7)) << "eps " << eps;
  }
}

// The FP8 GEMMs define their own precision (fp32 sums): CPU autocast to bf16 (te-encoder
// --dtype bf16) changes nothing in them.
TEST(Fp8Gemm, Fp32UnderCpuAutocast) {
  at::manual_seed(4);
  const at::Tensor a = at::randn({64, 384}), b = at::randn({384, 96});
  const Fp8Tensor qa = quantize_to_own_scale(a, DType::kE4M3);
  const Fp8Tensor qb = quantize_to_own_scale(b, DType::kE4M3);
  const Fp8Tensor ba = quantize_blocks(a, ScalingMode::kBlock1x128, DType::kE4M3, true, 0.0f);
  const Fp8Tensor bb = quantize_blocks(b.t(), ScalingMode::kBlock128x128, DType::kE4M3, true, 0.0f);
  const at::Tensor plain = gemm(qa, qb), blocked = gemm_nt(ba, bb);
  using te::test::CpuAutocast;  // bf16 for a scope
  at::Tensor plain_bf16, blocked_bf16, check;
  {
    const CpuAutocast bf16(true);
    plain_bf16 = gemm(qa, qb);
    blocked_bf16 = gemm_nt(ba, bb);
    check = at::mm(a, b);  // autocast is on: a bf16 product
  }
  EXPECT_EQ(check.scalar_type(), at::kBFloat16);
  EXPECT_EQ(plain_bf16.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(plain_bf16, plain));
  EXPECT_EQ(blocked_bf16.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(blocked_bf16, blocked));
}

}  // namespace
}  // namespace te::fp8
