// NVFP4BlockScaling held to TE's definitions (NVIDIA/TransformerEngine
// d0067d0da6cb01811b8072a7d304f0e00344ce2b; the files are cited in te/src/fp8/nvfp4.cpp) and
// CUDA's E2M1 conversion (cuda_fp4.h: round to nearest even, saturating, NaN -> +6):
// - E2M1 codes by hand, every code's value, the ties, stochastic rounding's neighbours and bias;
// - a block worked by hand (tensor scale, E4M3 block scale, codes, packing, dequantized values);
// - special blocks as TE's kernels treat them (zeros, NaN skipped by the amax, infinities, a
//   block whose scale underflows), 16x16 tiles, the round trip, the Hadamard transform;
// - the GEMM and fp8::linear under the recipe against the GEMMs written from the definition.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>

#include "../expect_error.h"
#include "te/fp8.h"
#include "te/kernels/fp4_cast.h"

namespace te::fp8 {
namespace {

const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

TEST(Nvfp4E2M1, CodesRoundToNearestEvenAndSaturate) {
  const float values[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0f, -0.5, -1, -1.5, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) {
    const float v = e2m1_to_float(static_cast<uint8_t>(c));
    EXPECT_TRUE(v == values[c] && std::signbit(v) == std::signbit(values[c])) << c;
    EXPECT_EQ(e2m1_round(values[c]), c) << c;
  }
  struct Case {
    float in;
    uint8_t code;
  };
  // Ties go to the even code: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4,
  // 5 -> 4; beyond 6 (and infinity) saturates; NaN is +6 (cuda_fp4.h).
  const Case cases[] = {{0.25f, 0x0},  {0.2500001f, 0x1}, {0.74f, 0x1}, {0.75f, 0x2}, {1.25f, 0x2},
                        {1.26f, 0x3},  {1.75f, 0x4},      {2.5f, 0x4},  {2.51f, 0x5}, {3.5f, 0x6},
                        {5.0f, 0x6},   {5.01f, 0x7},      {1e30f, 0x7}, {kInf, 0x7},  {-kInf, 0xF},
                        {kNaN, 0x7},   {-kNaN, 0x7},      {-0.3f, 0x9}, {-0.1f, 0x8}, {-5.0f, 0xE},
                        {1e-40f, 0x0}, {-2.5f, 0xC},      {0.0f, 0x0},  {-0.0f, 0x8}};
  for (const Case& c : cases) EXPECT_EQ(e2m1_round(c.in), c.code) << c.in;
}

TEST(Nvfp4E2M1, StochasticRoundingPicksANeighbourWithoutBias) {
  // Exact values stay, whatever the draw; saturation and NaN as round to nearest.
  for (const float v : {0.0f, 0.5f, 1.5f, 4.0f, -6.0f, 6.0f}) {
    for (const uint32_t r : {0u, 1u << 31, 0xFFFFFFFFu}) {
      EXPECT_EQ(e2m1_round_stochastic(v, r), e2m1_round(v)) << v << " " << r;
    }
  }
  EXPECT_EQ(e2m1_round_stochastic(7.0f, 0), 0x7);
  EXPECT_EQ(e2m1_round_stochastic(kNaN, 0), 0x7);
  // Between neighbours: the draw decides, and the mean over uniform draws is the value.
  uint32_t state = 12345;
  for (const float v : {0.3f, 0.9f, 2.2f, 3.9f, 5.5f, -1.1f, -4.4f}) {
    double sum = 0;
    const int n = 40000;
    const float lo = e2m1_to_float(e2m1_round_stochastic(v, 0xFFFFFFFFu));
    const float hi = e2m1_to_float(e2m1_round_stochastic(v, 0));
    EXPECT_LT(std::fabs(lo), std::fabs(v));
    EXPECT_GT(std::fabs(hi), std::fabs(v));
    for (int i = 0; i < n; ++i) {
      state = state * 1664525u + 1013904223u;
      const float q = e2m1_to_float(e2m1_round_stochastic(v, state));
      ASSERT_TRUE(q == lo || q == hi) << v << " -> " << q;
      sum += q;
    }
    // The mean's standard deviation is at most |hi - lo| / (2 sqrt(n)) = 0.0025 |hi - lo|.
    EXPECT_NEAR(sum / n, v, 0.015 * std::fabs(hi - lo)) << v;
  }
}

// A block worked by hand: x = 0..15, amax 15. S_enc = 2688 / 15 = 179.2; the block scale
// 15 * 179.2 / 6 = 448 (E4M3 0x7E); x is multiplied by 1 / (448 / 179.2) = 0.4 and rounded:
// 0 .4 .8 1.2 1.6 2 2.4 2.8 3.2 3.6 4 4.4 4.8 5.2 5.6 6 -> codes 0 1 2 2 3 4 4 5 5 6 6 6 6 7 7 7;
// each value is code * (448 * 15 / 2688) = code * 2.5.
TEST(Nvfp4, ABlockWorkedByHand) {
  const at::Tensor x = at::arange(16, at::kFloat).unsqueeze(0);
  const Fp8Tensor q = quantize_nvfp4(x);
  EXPECT_EQ(q.scaling, ScalingMode::kBlock1x16);
  ASSERT_EQ(q.data.sizes(), at::IntArrayRef({1, 8}));
  ASSERT_EQ(q.scale_inv.sizes(), at::IntArrayRef({1, 1}));
  EXPECT_EQ(q.scale_inv.item<uint8_t>(), 0x7E);
  EXPECT_EQ(q.amax.item<float>(), 15.0f);
  const uint8_t want[8] = {0x10, 0x22, 0x43, 0x54, 0x65, 0x66, 0x76, 0x77};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(q.data[0][i].item<uint8_t>(), want[i]) << i;
  const float values[16] = {0, 1.25, 2.5, 2.5, 3.75, 5, 5, 7.5, 7.5, 10, 10, 10, 10, 15, 15, 15};
  const at::Tensor d = q.dequantize();
  for (int i = 0; i < 16; ++i) EXPECT_EQ(d[0][i].item<float>(), values[i]) << i;
  // The amax a sharded caller passes (the whole tensor's) sets the tensor scale: 30 halves it,
  // so the block scale is 224 (0x76) and the codes are the same.
  Nvfp4Cast whole;
  whole.amax = 30.0f;
  const Fp8Tensor h = quantize_nvfp4(x, whole);
  EXPECT_EQ(h.scale_inv.item<uint8_t>(), 0x76);
  EXPECT_TRUE(at::equal(h.data, q.data));
  EXPECT_TRUE(at::equal(h.dequantize(), d));
}

// The cast written out with the scalar rules, block by block, for any shape and mode.
Fp8Tensor reference(const at::Tensor& x, ScalingMode mode) {
  const int64_t rows = x.size(0), cols = x.size(1),
                band = mode == ScalingMode::kBlock16x16 ? 16 : 1;
  const int64_t nb = (cols + 15) / 16, nr = (rows + band - 1) / band;
  at::Tensor data = at::zeros({rows, cols / 2}, at::kByte), scales = at::zeros({nr, nb}, at::kByte);
  const at::Tensor finite = at::where(at::isnan(x), at::zeros_like(x), x.abs());
  const float amax = finite.max().item<float>();
  float s_enc = std::fmin(2688.0f / amax, FLT_MAX);
  if (amax == 0.0f || s_enc == 0.0f) s_enc = 1.0f;
  for (int64_t br = 0; br < nr; ++br) {
    for (int64_t b = 0; b < nb; ++b) {
      const int64_t r0 = br * band, r1 = std::min(rows, r0 + band), c0 = b * 16,
                    c1 = std::min(cols, c0 + 16);
      const float block_amax = finite.slice(0, r0, r1).slice(1, c0, c1).max().item<float>();
      const uint8_t s =
          cast_to_fp8(std::fmin(block_amax * (s_enc * (1.0f / 6.0f)), FLT_MAX), DType::kE4M3);
      scales[br][b] = s;
      const float enc =
          std::fmin(1.0f / (cast_from_fp8(s, DType::kE4M3) * (1.0f / s_enc)), FLT_MAX);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) {
          const uint8_t code = e2m1_round(x[r][c].item<float>() * enc);
          const int64_t old = data[r][c / 2].item<uint8_t>();
          data[r][c / 2] = static_cast<uint8_t>(c % 2 ? old | (code << 4) : old | code);
        }
      }
    }
  }
  return {data, scales, DType::kE4M3, mode, at::full({1}, amax)};
}

// Awkward values: magnitudes 1e-6..1e6 across rows, a zero block, subnormals, a NaN, infinities
// of both signs in their own tensor, one outlier among small values, a ragged edge (cols 40).
TEST(Nvfp4, CastsEqualTheDefinitionBitForBit) {
  at::manual_seed(1);
  at::Tensor x = at::randn({37, 40}) * at::pow(10.0, at::linspace(-3, 3, 37)).unsqueeze(1);
  x[0].slice(0, 0, 16).zero_();
  x[1].slice(0, 16, 32).fill_(1e-40f);
  x[2][3] = kNaN;
  x[3][17] = 1e4f;  // an outlier among values near 1e-3
  for (const ScalingMode mode : {ScalingMode::kBlock1x16, ScalingMode::kBlock16x16}) {
    const Fp8Tensor q = quantize_nvfp4(x, Nvfp4Cast{mode});
    const Fp8Tensor r = reference(x, mode);
    EXPECT_TRUE(at::equal(q.scale_inv, r.scale_inv)) << to_string(mode);
    EXPECT_TRUE(at::equal(q.data, r.data)) << to_string(mode);
    EXPECT_EQ(q.amax.item<float>(), r.amax.item<float>());
    // NaN skipped by the amaxes; the NaN element itself is +6.
    EXPECT_EQ(q.data[2][1].item<uint8_t>() & 0xF0, 0x70);
  }
  at::Tensor inf = at::randn({16, 32});
  inf[4][5] = kInf;
  inf[9][20] = -kInf;
  const Fp8Tensor qi = quantize_nvfp4(inf);
  EXPECT_TRUE(at::equal(qi.data, reference(inf, ScalingMode::kBlock1x16).data));
  // amax infinite: S_enc = 1, the infinite elements' blocks saturate their scale at 448.
  EXPECT_EQ(qi.scale_inv[4][0].item<uint8_t>(), 0x7E);
  EXPECT_EQ(qi.data[4][2].item<uint8_t>() >> 4, 0x7);
  EXPECT_EQ(qi.data[9][10].item<uint8_t>() & 0xF, 0xF);
}

TEST(Nvfp4, SpecialBlocks) {
  // All zeros: amax 0 gives S_enc 1, scales 0, codes 0, values 0.
  const Fp8Tensor z = quantize_nvfp4(at::zeros({3, 32}));
  EXPECT_EQ(z.scale_inv.sum().item<int64_t>(), 0);
  EXPECT_EQ(z.data.sum().item<int64_t>(), 0);
  EXPECT_TRUE(at::equal(z.dequantize(), at::zeros({3, 32})));
  // A block whose scale underflows E4M3 (its amax below 2^-10 / 448 of the tensor's): scale 0,
  // its elements multiplied by FLT_MAX (TE's fminf) saturate, and its values are 0.
  at::Tensor x = at::ones({1, 32});
  x.slice(1, 16, 32).fill_(1e-7f);
  const Fp8Tensor u = quantize_nvfp4(x);
  EXPECT_EQ(u.scale_inv[0][1].item<uint8_t>(), 0);
  EXPECT_EQ(u.data[0][12].item<uint8_t>(), 0x77);
  EXPECT_TRUE(at::equal(u.dequantize().slice(1, 16, 32), at::zeros({1, 16})));
  // One outlier: its block's small elements round to zero, the other block keeps its detail.
  at::Tensor o = at::full({1, 32}, 0.01f);
  o[0][3] = 100.0f;
  const at::Tensor d = quantize_nvfp4(o).dequantize();
  EXPECT_EQ(d[0][0].item<float>(), 0.0f);
  EXPECT_NEAR(d[0][3].item<float>(), 100.0f, 1e-3);
  EXPECT_NEAR(d[0][20].item<float>(), 0.01f, 1e-3);
}

TEST(Nvfp4, RoundTripTilesAndStochasticCasts) {
  at::manual_seed(2);
  const at::Tensor x = at::randn({48, 64});
  for (const ScalingMode mode : {ScalingMode::kBlock1x16, ScalingMode::kBlock16x16}) {
    const at::Tensor d = quantize_nvfp4(x, Nvfp4Cast{mode}).dequantize();
    // Half E2M1's widest gap (2 of 6) of the block amax, plus E4M3's rounding of the scale.
    const at::Tensor band = mode == ScalingMode::kBlock16x16
                                ? at::amax(x.abs().reshape({3, 16, 4, 16}), {1, 3}, true)
                                      .expand({3, 16, 4, 16})
                                      .reshape({48, 64})
                                : at::amax(x.abs().reshape({48, 4, 16}), {2}, true)
                                      .expand({48, 4, 16})
                                      .reshape({48, 64});
    EXPECT_TRUE(((d - x).abs() <= band * (1.0 / 6.0) * 1.07).all().item<bool>()) << to_string(mode);
    EXPECT_LT((d - x).norm().item<float>() / x.norm().item<float>(), 0.15f);
  }
  // A 16x16 tile is the same tile of x^T: the transpose's scales are the scales transposed.
  const Fp8Tensor t = quantize_nvfp4(x, Nvfp4Cast{ScalingMode::kBlock16x16});
  const Fp8Tensor tt = quantize_nvfp4(x.t(), Nvfp4Cast{ScalingMode::kBlock16x16});
  EXPECT_TRUE(at::equal(tt.scale_inv, t.scale_inv.t()));
  EXPECT_TRUE(at::equal(tt.dequantize(), t.dequantize().t()));
  // So transpose_tiles gives the cast of x^T bit for bit (the recipe's dgrad kernel from its
  // forward one), ragged tiles included; odd rows cannot pack along the transpose.
  for (const auto& shape : {std::vector<int64_t>{48, 64}, std::vector<int64_t>{38, 50}}) {
    const at::Tensor y = at::randn(shape);
    Nvfp4Cast tiles{ScalingMode::kBlock16x16};
    tiles.amax = y.abs().max().item<float>();
    const Fp8Tensor moved = transpose_tiles(quantize_nvfp4(y, tiles));
    const Fp8Tensor cast = quantize_nvfp4(y.t(), tiles);
    EXPECT_TRUE(at::equal(moved.data, cast.data)) << shape[0];
    EXPECT_TRUE(at::equal(moved.scale_inv, cast.scale_inv)) << shape[0];
    EXPECT_TRUE(at::equal(moved.amax, cast.amax)) << shape[0];
  }
  EXPECT_ERROR(
      transpose_tiles(quantize_nvfp4(at::randn({17, 32}), Nvfp4Cast{ScalingMode::kBlock16x16})),
      "the rows must be even");
  // Stochastic rounding: the same (seed, call) draws the same codes, another call others; the
  // mean of many casts approaches x, as no single rounding to nearest does.
  Nvfp4Cast sr;
  sr.stochastic = true;
  sr.seed = 7;
  const Fp8Tensor a = quantize_nvfp4(x, sr), b = quantize_nvfp4(x, sr);
  EXPECT_TRUE(at::equal(a.data, b.data));
  at::Tensor mean = at::zeros_like(x);
  const int casts = 200;
  for (int i = 0; i < casts; ++i) {
    sr.call = static_cast<uint64_t>(i);
    const Fp8Tensor c = quantize_nvfp4(x, sr);
    if (i == 1) EXPECT_FALSE(at::equal(c.data, a.data));
    EXPECT_TRUE(at::equal(c.scale_inv, a.scale_inv));
    mean += c.dequantize();
  }
  mean /= casts;
  const float nearest = (quantize_nvfp4(x).dequantize() - x).norm().item<float>();
  EXPECT_LT((mean - x).norm().item<float>(), nearest * 0.25f);
}

TEST(Nvfp4, HadamardTransformIsTesAndOrthogonal) {
  // e_i's transform is row i of D H / 4: TE's sign i times (-1)^popcount(i & j) / 4.
  const int signs[16] = {1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1};
  const at::Tensor h = hadamard16(at::eye(16));
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      const float want = signs[i] * (__builtin_popcount(i & j) % 2 ? -0.25f : 0.25f);
      ASSERT_EQ(h[i][j].item<float>(), want) << i << " " << j;
    }
  }
  // Two operands transformed along the dim they contract multiply to the same product, a
  // ragged dim (40) padded with zeros to 48.
  at::manual_seed(3);
  const at::Tensor a = at::randn({8, 40}), b = at::randn({5, 40});
  const at::Tensor ha = hadamard16(a), hb = hadamard16(b);
  ASSERT_EQ(ha.sizes(), at::IntArrayRef({8, 48}));
  EXPECT_TRUE(at::allclose(at::mm(ha, hb.t()), at::mm(a, b.t()), 1e-5, 1e-5));
  // An outlier spreads over its block of 16: the transform is what NVFP4 takes it for.
  at::Tensor spike = at::zeros({1, 16});
  spike[0][5] = 16.0f;
  EXPECT_TRUE(at::equal(hadamard16(spike).abs(), at::full({1, 16}, 4.0f)));
}

TEST(Nvfp4, GemmMultipliesTheDequantizedOperands) {
  at::manual_seed(4);
  const at::Tensor x = at::randn({40, 96}), w = at::randn({96, 30});
  const Fp8Tensor a = quantize_nvfp4(x), b_t = quantize_nvfp4(w.t(), {ScalingMode::kBlock16x16});
  const at::Tensor y = gemm_nt(a, b_t);
  // Each operand's values are code * scale * amax / 2688 (dequantize_nvfp4.cuh), fp32 products.
  EXPECT_TRUE(at::allclose(y, at::mm(a.dequantize(), b_t.dequantize().t()), 1e-6, 1e-6));
  const at::Tensor exact = at::mm(x, w);
  EXPECT_LT((y - exact).norm().item<float>() / exact.norm().item<float>(), 0.2f);
  EXPECT_GT((y - exact).norm().item<float>() / exact.norm().item<float>(), 0.01f);
}

TEST(Nvfp4, MisuseIsRefusedByName) {
  const at::Tensor x = at::randn({4, 32});
  EXPECT_ERROR(quantize_nvfp4(at::randn({4, 31})),
               "a [4, 31] tensor has an odd number of columns (31)");
  EXPECT_ERROR(quantize_nvfp4(at::randn({2, 3, 4})), "block scaling takes a 2-D tensor");
  EXPECT_ERROR(quantize_nvfp4(x.to(at::kInt)), "cannot cast a Int tensor to NVFP4");
  EXPECT_ERROR(quantize_nvfp4(x, {ScalingMode::kBlock1x32}),
               "scaling mode '1x32' is not one of NVFP4's (1x16, 16x16)");
  const Fp8Tensor q = quantize_nvfp4(x);
  const Fp8Tensor mx = quantize_mx(x, DType::kE4M3);
  EXPECT_ERROR(gemm_nt(q, mx), "a is scaled per 1x16 and b_t per 1x32");
  EXPECT_ERROR(gemm_nt(q, quantize_nvfp4(at::randn({4, 64}))),
               "a [4, 16] and b_t [4, 32] do not multiply; give a [M, K] and b [K, N] (b_t [N, K]) "
               "(NVFP4 codes: [M, K / 2] and [N, K / 2], two a byte)");
  EXPECT_ERROR(gemm_nt(q, quantize_blocks(x, ScalingMode::kBlock1x128, DType::kE4M3, true, 0.0f)),
               "NVFP4's E2M1 operands (1x16, 16x16) multiply only NVFP4 operands");
  Fp8Tensor relabelled = mx;  // MXFP8's codes and scales called NVFP4's
  relabelled.scaling = ScalingMode::kBlock1x16;
  relabelled.amax = at::ones({1});
  EXPECT_ERROR(relabelled.dequantize(),
               "scale_inv [4, 1] for [4, 32] packed E2M1 codes in 1x16 blocks; it must be E4M3 "
               "(uint8) [4, 4]");
  Fp8Tensor no_amax = q;
  no_amax.amax = at::Tensor();
  EXPECT_ERROR(no_amax.dequantize(), "an NVFP4 tensor needs its amax");
  EXPECT_ERROR(quantize_blocks(x, ScalingMode::kBlock1x16, DType::kE4M3, true, 0.0f),
               "'1x16' is not a block mode of Float8BlockScaling");
}

TEST(Nvfp4, RecipeByNameAndDefaults) {
  const Recipe r = recipe_named("nvfp4");
  ASSERT_TRUE(r.is<NVFP4BlockScaling>());
  const NVFP4BlockScaling& s = *r.get_if<NVFP4BlockScaling>();
  EXPECT_FALSE(s.disable_rht || s.disable_stochastic_rounding || s.disable_2d_quantization);
  EXPECT_EQ(r.name(), "nvfp4");
  EXPECT_EQ(r.to_string(),
            "NVFP4BlockScaling(x=1x16, x^T=RHT+1x16, w=16x16, grad=SR+1x16, grad^T=RHT, seed=0)");
  const Recipe plain{NVFP4BlockScaling{true, true, true, 3}};
  EXPECT_EQ(plain.to_string(), "NVFP4BlockScaling(x=1x16, w=1x16, grad=1x16, seed=3)");
  EXPECT_NE(recipe_summary().find("nvfp4 (NVFP4BlockScaling: E2M1 with E4M3 scales"),
            std::string::npos);
}

// fp8::linear under NVFP4 equals the GEMMs written from the definition: forward x (1x16) by w^T
// (16x16 tiles), dgrad g by w (16x16), wgrad the Hadamard-transformed x^T by g^T, each with its
// own tensor amax; stochastic rounding off, so every cast is determined.
TEST(Nvfp4, LinearEqualsTheDefinition) {
  at::manual_seed(5);
  const at::Tensor x0 = at::randn({2, 24, 64}), w0 = at::randn({64, 48}) * 0.1;
  const at::Tensor g = at::randn({2, 24, 48});
  const at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  auto meta = std::make_shared<GemmMeta>();
  NVFP4BlockScaling recipe;
  recipe.disable_stochastic_rounding = true;
  at::Tensor y;
  {
    Fp8Autocast fp8(true, recipe);
    y = linear(x, w, meta);
  }
  y.backward(g);
  auto dq = [](const at::Tensor& t, ScalingMode mode) {
    return quantize_nvfp4(t, Nvfp4Cast{mode}).dequantize();
  };
  const ScalingMode row = ScalingMode::kBlock1x16, tile = ScalingMode::kBlock16x16;
  const at::Tensor x2 = x0.reshape({-1, 64}), g2 = g.reshape({-1, 48});
  EXPECT_TRUE(
      at::allclose(y.reshape({-1, 48}), at::mm(dq(x2, row), dq(w0.t(), tile).t()), 1e-5, 1e-5));
  EXPECT_TRUE(
      at::allclose(x.grad().reshape({-1, 64}), at::mm(dq(g2, row), dq(w0, tile).t()), 1e-5, 1e-5));
  const at::Tensor gw_ref = at::mm(dq(hadamard16(x2.t()), row), dq(hadamard16(g2.t()), row).t());
  EXPECT_TRUE(at::allclose(w.grad(), gw_ref, 1e-5, 1e-5));
  // Without the transform the wgrad differs (the transform is applied, not skipped).
  const at::Tensor gw_plain = at::mm(dq(x2.t(), row), dq(g2.t(), row).t());
  EXPECT_FALSE(at::allclose(w.grad(), gw_plain, 1e-5, 1e-5));
  // And it approximates the exact gradient.
  const at::Tensor gw_exact = at::mm(x2.t(), g2);
  EXPECT_LT((w.grad() - gw_exact).norm().item<float>() / gw_exact.norm().item<float>(), 0.2f);
  EXPECT_FALSE(meta->fwd_amax_history.defined());  // no state kept
}

// With stochastic rounding the gradients vary from step to step around the exact ones.
TEST(Nvfp4, StochasticGradientsAverageOut) {
  at::manual_seed(6);
  const at::Tensor x0 = at::randn({32, 32}), w0 = at::randn({32, 32}) * 0.1;
  const at::Tensor g = at::randn({32, 32});
  const Recipe recipe{NVFP4BlockScaling{}};
  auto meta = std::make_shared<GemmMeta>();
  at::Tensor first, mean = at::zeros({32, 32});
  const int steps = 64;
  for (int i = 0; i < steps; ++i) {
    const at::Tensor x = x0.clone().requires_grad_();
    {
      Fp8Autocast fp8(true, recipe);
      linear(x, w0, meta).backward(g);
    }
    if (i == 0) first = x.grad().clone();
    if (i == 1) EXPECT_FALSE(at::equal(x.grad(), first));
    mean += x.grad();
  }
  mean /= steps;
  // The average's error is below one step's: what the deterministic dgrad's bias would not do.
  const at::Tensor w_q = quantize_nvfp4(w0, Nvfp4Cast{ScalingMode::kBlock16x16}).dequantize();
  const at::Tensor unbiased = at::mm(g, w_q.t());
  EXPECT_LT((mean - unbiased).norm().item<float>(), 0.3f * (first - unbiased).norm().item<float>());
}

}  // namespace
}  // namespace te::fp8
