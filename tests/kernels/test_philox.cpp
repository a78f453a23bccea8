// Philox 4x32-10 against Random123's published known answers, and the dropout multipliers of a
// box against the same elements of the whole tensor.

#include <gtest/gtest.h>

#include <vector>

#include "te/kernels/philox.h"

namespace te::kernels {
namespace {

using Words = std::array<uint32_t, 4>;

TEST(Philox, KnownAnswersOfRandom123) {
  EXPECT_EQ(philox4x32_10({0, 0, 0, 0}, {0, 0}),
            (Words{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                          {0xffffffffu, 0xffffffffu}),
            (Words{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  EXPECT_EQ(philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                          {0xa4093822u, 0x299f31d0u}),
            (Words{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

// Element g of the global tensor: lane g % 4 of block (g / 4, call) under key seed.
float expected(uint64_t g, uint64_t seed, uint64_t call, uint32_t threshold, float scale) {
  const uint64_t block = g / 4;
  const Words w = philox4x32_10({static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                                 static_cast<uint32_t>(call), static_cast<uint32_t>(call >> 32)},
                                {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  return w[g % 4] >= threshold ? scale : 0.0f;
}

TEST(Philox, MultipliersOfABoxAreThoseOfTheGlobalElements) {
  // Awkward shapes and offsets: rows that start mid-block, boxes wider than 64 words, one dim.
  struct Case {
    std::vector<int64_t> global, offset, length;
  };
  const std::vector<Case> cases = {
      {{1, 1296}, {0, 0}, {1, 1296}},
      {{5, 4, 3, 160}, {1, 2, 0, 37}, {3, 2, 3, 101}},
      {{217, 256}, {109, 128}, {108, 128}},
      {{7}, {3}, {4}},
      {{3, 5}, {2, 5}, {1, 0}},
  };
  const uint64_t seed = 0x123456789abcdefull, call = (uint64_t{1} << 32) + 7;
  const uint32_t threshold = drop_threshold(0.3);
  const float scale = 1.0f / 0.7f;
  for (const Case& c : cases) {
    const int nd = static_cast<int>(c.global.size());
    int64_t n = 1, rows = 1;
    for (int d = 0; d < nd; ++d) n *= c.length[d];
    for (int d = 0; d + 1 < nd; ++d) rows *= c.length[d];
    std::vector<float> out(static_cast<std::size_t>(n), -1.0f);
    GlobalBox box{c.global.data(), c.offset.data(), c.length.data(), nd};
    // In two calls, split at an odd row, as parallel tasks would.
    const int64_t split = rows / 2 + (rows > 2 ? 1 : 0);
    dropout_multipliers(box, 0, split, seed, call, threshold, scale, out.data());
    dropout_multipliers(box, split, rows, seed, call, threshold, scale,
                        out.data() + split * c.length[nd - 1]);
    std::vector<int64_t> idx(static_cast<std::size_t>(nd), 0);
    for (int64_t i = 0; i < n; ++i) {
      uint64_t g = 0;
      for (int d = 0; d < nd; ++d) g = g * c.global[d] + c.offset[d] + idx[d];
      ASSERT_EQ(out[i], expected(g, seed, call, threshold, scale))
          << "element " << i << " (global " << g << ") of box " << i;
      // The element mapping the CUDA kernel compiles draws the same word.
      ASSERT_EQ(out[i], dropout_word(g, seed, call) >= threshold ? scale : 0.0f)
          << "element " << i << " (global " << g << ")";
      for (int d = nd - 1; d >= 0; --d) {
        if (++idx[d] < c.length[d]) break;
        idx[d] = 0;
      }
    }
  }
}

TEST(Philox, DropThresholdIsPTimes2To32) {
  EXPECT_EQ(drop_threshold(0.0), 0u);
  EXPECT_EQ(drop_threshold(0.5), 0x80000000u);
  EXPECT_EQ(drop_threshold(0.25), 0x40000000u);
  try {
    drop_threshold(1.0);
    FAIL();
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("dropout probability 1 is not in [0, 1)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace te::kernels
