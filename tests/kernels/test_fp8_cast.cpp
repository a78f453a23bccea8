// FP8 casts against NVIDIA's cuda_fp8.h host conversions (the oracle, compiled in when the CUDA
// toolkit is found) and against the formats' definitions.

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "te/error.h"
#include "te/kernels/fp4_cast.h"
#include "te/kernels/fp8_cast.h"

#ifdef TE_FP8_ORACLE
#include <cuda_fp8.h>
#endif

#include "float_bits.h"

namespace te::fp8 {
namespace {

using test::bits_of;
using test::from_bits;

const DType kTypes[] = {DType::kE4M3, DType::kE5M2};

TEST(Fp8Format, DecodesTheDefiningValues) {
  EXPECT_EQ(cast_from_fp8(0x7E, DType::kE4M3), 448.0f);
  EXPECT_EQ(cast_from_fp8(0xFE, DType::kE4M3), -448.0f);
  EXPECT_TRUE(std::isnan(cast_from_fp8(0x7F, DType::kE4M3)));
  EXPECT_EQ(cast_from_fp8(0x01, DType::kE4M3), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(cast_from_fp8(0x08, DType::kE4M3), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(cast_from_fp8(0x38, DType::kE4M3), 1.0f);
  EXPECT_EQ(cast_from_fp8(0x7B, DType::kE5M2), 57344.0f);
  EXPECT_EQ(cast_from_fp8(0x7C, DType::kE5M2), INFINITY);
  EXPECT_EQ(cast_from_fp8(0xFC, DType::kE5M2), -INFINITY);
  EXPECT_TRUE(std::isnan(cast_from_fp8(0x7E, DType::kE5M2)));
  EXPECT_EQ(cast_from_fp8(0x01, DType::kE5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(cast_from_fp8(0x3C, DType::kE5M2), 1.0f);
  EXPECT_EQ(max_finite(DType::kE4M3), 448.0f);
  EXPECT_EQ(max_finite(DType::kE5M2), 57344.0f);
}

TEST(Fp8Format, EveryFiniteValueRoundTrips) {
  for (DType t : kTypes) {
    for (int c = 0; c < 256; ++c) {
      const float v = cast_from_fp8(static_cast<uint8_t>(c), t);
      if (std::isnan(v) || std::isinf(v)) continue;
      // -0 encodes as 0x80, +0 as 0x00: the sign survives.
      EXPECT_EQ(cast_to_fp8(v, t), c) << "code " << c << " value " << v;
    }
  }
}

TEST(Fp8Format, TiesGoToEvenAndOverflowSaturates) {
  // 1 + 1/16 lies halfway between 1 (0x38, even) and 1.125 (0x39): to even.
  EXPECT_EQ(cast_to_fp8(1.0625f, DType::kE4M3), 0x38);
  // 1.125 + 1/16 lies halfway between 0x39 (odd) and 0x3A: to even, up.
  EXPECT_EQ(cast_to_fp8(1.1875f, DType::kE4M3), 0x3A);
  EXPECT_EQ(cast_to_fp8(464.0f, DType::kE4M3), 0x7E);
  EXPECT_EQ(cast_to_fp8(1e30f, DType::kE4M3), 0x7E);
  EXPECT_EQ(cast_to_fp8(-INFINITY, DType::kE4M3), 0xFE);
  EXPECT_EQ(cast_to_fp8(INFINITY, DType::kE5M2), 0x7B);
  EXPECT_EQ(cast_to_fp8(std::nanf(""), DType::kE4M3), 0x7F);
  EXPECT_EQ(cast_to_fp8(-std::nanf(""), DType::kE5M2), 0x7F);
  EXPECT_EQ(cast_to_fp8(std::ldexp(1.0f, -10), DType::kE4M3), 0x00);  // half the smallest: even
  EXPECT_EQ(cast_to_fp8(std::ldexp(1.5f, -10), DType::kE4M3), 0x01);
  EXPECT_EQ(cast_to_fp8(-0.0f, DType::kE5M2), 0x80);
}

TEST(Fp8Format, QuantizeEqualsTheScalarCastEverywhere) {
  // The vectorised loop and the scalar cast must agree bit for bit, specials included.
  std::mt19937 gen(7);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::vector<float> in;
  for (int i = 0; i < 2'000'000; ++i) in.push_back(from_bits(any_bits(gen)));
  for (float v : {0.0f, -0.0f, INFINITY, -INFINITY, 448.0f, 464.0f, 57344.0f, 61440.0f,
                  std::ldexp(1.0f, -10), std::ldexp(1.0f, -17), std::nanf("")}) {
    in.push_back(v);
  }
  for (int c = 0; c < 256; ++c) {
    in.push_back(cast_from_fp8(static_cast<uint8_t>(c), DType::kE4M3));
    in.push_back(cast_from_fp8(static_cast<uint8_t>(c), DType::kE5M2));
  }
  std::vector<uint8_t> out(in.size());
  for (DType t : kTypes) {
    quantize(in.data(), out.data(), static_cast<int64_t>(in.size()), 1.0f, t);
    int mismatches = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      if (out[i] != cast_to_fp8(in[i], t) && mismatches++ < 5) {
        ADD_FAILURE() << "value " << in[i] << " bits 0x" << std::hex << bits_of(in[i])
                      << ": quantize 0x" << int(out[i]) << ", cast 0x"
                      << int(cast_to_fp8(in[i], t));
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

// The block-scaled kernels (a row per call, blocks of 16, 32, 128 and an odd width, a ragged last
// block) equal their scalar rules bit for bit, specials included: NaN skipped by the amaxes,
// saturation, subnormal scales. Under each TE_FP8_ISA set as above.
TEST(Fp8Format, BlockKernelsEqualTheirScalarRules) {
  std::mt19937 gen(11);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const int64_t n = 1000;  // 62.5 blocks of 16, 31.25 of 32, 7.8 of 128
  std::vector<float> row;
  for (int64_t i = 0; i < n; ++i) {
    row.push_back(i % 97 == 5 ? from_bits(any_bits(gen)) : normal(gen) * (i % 50 == 7 ? 1e4f : 1));
  }
  row[3] = std::nanf("");
  row[40] = INFINITY;
  row[41] = -0.0f;
  for (int64_t i = 600; i < 640; ++i) row[i] = 1e-41f;  // a block of subnormals
  for (const int64_t width : {int64_t{16}, int64_t{32}, int64_t{128}, int64_t{7}}) {
    const int64_t nb = (n + width - 1) / width;
    std::vector<float> amax(static_cast<std::size_t>(nb), 0.5f), want(amax);
    fold_block_amaxes(row.data(), n, width, amax.data());
    for (int64_t i = 0; i < n; ++i) {
      const float a = std::fabs(row[i]);
      float& w = want[static_cast<std::size_t>(i / width)];
      if (!std::isnan(a) && a > w) w = a;
    }
    for (int64_t b = 0; b < nb; ++b) EXPECT_EQ(bits_of(amax[b]), bits_of(want[b])) << width;
    std::vector<float> scale(amax.size());
    for (int64_t b = 0; b < nb; ++b)
      scale[b] = b % 3 == 0 ? 448.0f / want[b] : std::ldexp(1.0f, int(b % 9) - 4);
    for (DType t : kTypes) {
      std::vector<uint8_t> out(static_cast<std::size_t>(n));
      quantize_blocks_row(row.data(), out.data(), n, width, scale.data(), t);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(out[i], cast_to_fp8(row[i] * scale[i / width], t)) << width << " element " << i;
      }
    }
    if (width != 16) continue;
    // NVFP4: the scales of each block (its E4M3 code and the factor its elements take), then the
    // packed E2M1 codes.
    const float s_dec = 1.0f / 37.5f, factor = 37.5f / 6.0f;
    std::vector<uint8_t> codes(amax.size());
    std::vector<float> encode(amax.size());
    nvfp4_block_scales(want.data(), nb, factor, s_dec, codes.data(), encode.data());
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t code = cast_to_fp8(std::fmin(want[b] * factor, FLT_MAX), DType::kE4M3);
      EXPECT_EQ(codes[b], code) << b;
      EXPECT_EQ(bits_of(encode[b]),
                bits_of(std::fmin(1.0f / (cast_from_fp8(code, DType::kE4M3) * s_dec), FLT_MAX)))
          << b;
    }
    std::vector<uint8_t> packed(static_cast<std::size_t>(n / 2));
    nvfp4_quantize_row(row.data(), packed.data(), n, encode.data());
    for (int64_t i = 0; i < n; i += 2) {
      const uint8_t lo = e2m1_round(row[i] * encode[i / 16]);
      const uint8_t hi = e2m1_round(row[i + 1] * encode[(i + 1) / 16]);
      ASSERT_EQ(packed[i / 2], lo | (hi << 4)) << "element " << i;
    }
  }
}

// Under TE_FP8_ISA (CTest runs the casts once per set): the set asked for is the one in use; a
// set this CPU lacks skips; an unknown name is an error that names it and the choices.
TEST(Fp8Isa, ReportsTheInstructionSetInUse) {
  const char* forced = std::getenv("TE_FP8_ISA");
  const bool known =
      forced != nullptr && (std::string(forced) == "avx512" || std::string(forced) == "avx2" ||
                            std::string(forced) == "baseline");
  std::string isa;
  try {
    isa = kernel_isa();
  } catch (const te::Error& e) {
    const std::string msg = e.what();
    ASSERT_NE(forced, nullptr) << "kernel_isa failed without TE_FP8_ISA: " << msg;
    if (known) GTEST_SKIP() << msg;
    EXPECT_NE(
        msg.find(std::string("TE_FP8_ISA=") + forced + " is not an instruction set this CPU runs"),
        std::string::npos)
        << msg;
    EXPECT_NE(msg.find("use one of"), std::string::npos) << msg;
    return;
  }
  ASSERT_TRUE(forced == nullptr || known) << "TE_FP8_ISA=" << forced << " was accepted as " << isa;
  std::cout << "instruction set: " << isa << "\n";
  EXPECT_TRUE(isa == "avx512" || isa == "avx2" || isa == "baseline") << isa;
  if (forced != nullptr) EXPECT_EQ(isa, forced);
}

TEST(Fp8Format, QuantizeAppliesTheScaleAndReportsAmax) {
  const std::vector<float> in = {1.0f, -2.0f, 0.5f, 300.0f};
  std::vector<uint8_t> out(in.size());
  EXPECT_EQ(quantize(in.data(), out.data(), 4, 2.0f, DType::kE4M3), 300.0f);
  EXPECT_EQ(out[0], cast_to_fp8(2.0f, DType::kE4M3));
  EXPECT_EQ(out[1], cast_to_fp8(-4.0f, DType::kE4M3));
  EXPECT_EQ(out[3], 0x7E);  // 600 saturates
  std::vector<float> back(in.size());
  dequantize(out.data(), back.data(), 4, 0.5f, DType::kE4M3);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[3], 224.0f);
  const std::vector<float> with_nan = {1.0f, std::nanf("")};
  EXPECT_TRUE(std::isnan(quantize(with_nan.data(), out.data(), 2, 1.0f, DType::kE5M2)));
}

#ifdef TE_FP8_ORACLE

__nv_fp8_interpretation_t nv(DType t) { return t == DType::kE4M3 ? __NV_E4M3 : __NV_E5M2; }

uint8_t oracle(float v, DType t) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, nv(t)));
}

// Compares one value; returns false (and reports) on the first few mismatches only.
bool agrees(float v, DType t, int& reported) {
  const uint8_t mine = cast_to_fp8(v, t), theirs = oracle(v, t);
  if (mine == theirs) return true;
  if (reported++ < 10) {
    ADD_FAILURE() << (t == DType::kE4M3 ? "E4M3" : "E5M2") << " " << v << " (bits 0x" << std::hex
                  << bits_of(v) << "): mine 0x" << int(mine) << ", cuda_fp8.h 0x" << int(theirs);
  }
  return false;
}

TEST(Fp8Oracle, AllDecodesMatchCudaFp8) {
  for (DType t : kTypes) {
    for (int c = 0; c < 256; ++c) {
      const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(c), nv(t));
      // Half to float by hand (1 sign, 5 exponent, 10 mantissa bits).
      const uint32_t s = h.x >> 15, e = (h.x >> 10) & 0x1F, m = h.x & 0x3FF;
      float want;
      if (e == 0x1F) {
        want = m ? std::nanf("") : INFINITY;
      } else if (e == 0) {
        want = std::ldexp(static_cast<float>(m), -24);
      } else {
        want = std::ldexp(static_cast<float>(m + 1024), static_cast<int>(e) - 25);
      }
      if (s) want = -want;
      const float mine = cast_from_fp8(static_cast<uint8_t>(c), t);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(mine)) << c;
      } else {
        EXPECT_EQ(mine, want) << "code " << c;
      }
    }
  }
}

TEST(Fp8Oracle, ValuesMidpointsNeighboursAndSpecialsMatchCudaFp8) {
  for (DType t : kTypes) {
    int reported = 0;
    std::vector<float> values = {0.0f,
                                 -0.0f,
                                 INFINITY,
                                 -INFINITY,
                                 std::nanf(""),
                                 -std::nanf(""),
                                 std::numeric_limits<float>::denorm_min(),
                                 std::numeric_limits<float>::max(),
                                 1e-30f,
                                 -1e-30f};
    std::vector<float> finite;
    for (int c = 0; c < 256; ++c) {
      const float v = cast_from_fp8(static_cast<uint8_t>(c), t);
      if (!std::isnan(v) && !std::isinf(v)) finite.push_back(v);
    }
    std::sort(finite.begin(), finite.end());
    finite.erase(std::unique(finite.begin(), finite.end()), finite.end());
    for (std::size_t i = 0; i < finite.size(); ++i) {
      values.push_back(finite[i]);
      if (i + 1 < finite.size()) {
        const float mid = (finite[i] + finite[i + 1]) / 2;  // exact: few mantissa bits
        values.push_back(mid);
        values.push_back(std::nextafter(mid, INFINITY));
        values.push_back(std::nextafter(mid, -INFINITY));
      }
    }
    // Beyond the largest finite value: its half-step midpoint and neighbours, and far out.
    const float top = max_finite(t), step = top / (t == DType::kE4M3 ? 14.0f : 7.0f);
    for (float v : {top + step / 2, top + step, std::nextafter(top + step / 2, 0.0f), 1e20f}) {
      values.push_back(v);
      values.push_back(-v);
    }
    for (float v : values) agrees(v, t, reported);
    EXPECT_EQ(reported, 0);
  }
}

TEST(Fp8Oracle, TenMillionRandomFloatsMatchCudaFp8) {
  std::mt19937 gen(2026);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::normal_distribution<float> near_range(0.0f, 100.0f);
  for (DType t : kTypes) {
    int reported = 0;
    for (int i = 0; i < 5'000'000; ++i) {
      agrees(from_bits(any_bits(gen)), t, reported);  // every exponent, NaNs and infinities
      agrees(near_range(gen), t, reported);           // the format's own range, densely
    }
    EXPECT_EQ(reported, 0);
  }
}

#else

TEST(Fp8Oracle, NeedsTheCudaToolkit) {
  GTEST_SKIP() << "cuda_fp8.h not found: configure with the CUDA toolkit (TE_CUDA=AUTO) to "
                  "check the casts against NVIDIA's conversions";
}

#endif

}  // namespace
}  // namespace te::fp8
