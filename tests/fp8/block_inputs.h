#pragma once

// Inputs the block-scaled FP8 tests share (test_block_scaling.cpp, test_mxfp8.cpp).

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

namespace te::fp8::test {

inline uint32_t bits_of(float f) {
  uint32_t b = 0;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

// Awkward values for blocks `width` wide: per-row magnitudes from 1e-6 to 1e6, a zero block,
// a subnormal block, values beyond the format's range after scaling, a NaN, an infinity, and one
// outlier among small values.
inline at::Tensor awkward(int64_t rows, int64_t cols, uint64_t seed, int64_t width = 128) {
  at::manual_seed(seed);
  at::Tensor x = at::randn({rows, cols}) *
                 at::pow(10.0, at::linspace(-6, 6, rows)).to(at::kFloat).unsqueeze(1);
  if (cols > width + 2 && rows > 3) {
    x[1].narrow(0, 0, width).zero_();
    x[2].narrow(0, width, std::min<int64_t>(width, cols - width)).fill_(1e-40f);  // subnormals
    x[2][5] = 3e38f;
    x[3][7] = std::numeric_limits<float>::quiet_NaN();
    x[3][width + 12] = -std::numeric_limits<float>::infinity();
    x[0][3] = 1e4f;  // an outlier among values ~1e-6
  }
  return x;
}

}  // namespace te::fp8::test
