#include <algorithm>
#include <cmath>
#include <vector>

#include "philox_core.h"
#include "te/error.h"
#include "te/kernels/philox.h"

namespace te::kernels {

namespace {

using philox::kWeyl0;
using philox::kWeyl1;

// Blocks computed together: the rounds run over arrays of this many counters, which the
// compiler turns into vector multiplies (32x32 -> 64-bit lanes).
constexpr int kLanes = 16;

// Philox 4x32-10 on kLanes counters (c0 = block low, c1 = block high, c2/c3 = the call, shared).
void philox_lanes(uint64_t first_block, uint32_t call_lo, uint32_t call_hi, uint32_t key_lo,
                  uint32_t key_hi, uint32_t (&words)[4 * kLanes]) {
  uint32_t x0[kLanes], x1[kLanes], x2[kLanes], x3[kLanes];
  for (int i = 0; i < kLanes; ++i) {
    const uint64_t block = first_block + static_cast<uint64_t>(i);
    x0[i] = static_cast<uint32_t>(block);
    x1[i] = static_cast<uint32_t>(block >> 32);
    x2[i] = call_lo;
    x3[i] = call_hi;
  }
  uint32_t k0 = key_lo, k1 = key_hi;
  for (int round = 0; round < philox::kRounds; ++round) {
    for (int i = 0; i < kLanes; ++i) philox::round(x0[i], x1[i], x2[i], x3[i], k0, k1);
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  for (int i = 0; i < kLanes; ++i) {
    words[4 * i + 0] = x0[i];
    words[4 * i + 1] = x1[i];
    words[4 * i + 2] = x2[i];
    words[4 * i + 3] = x3[i];
  }
}

}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < philox::kRounds; ++round) {
    philox::round(c[0], c[1], c[2], c[3], k[0], k[1]);
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

uint32_t dropout_word(uint64_t g, uint64_t seed, uint64_t call) {
  return philox::word_of(g, seed, call);
}

std::array<uint32_t, 4> dropout_words(uint64_t block, uint64_t seed, uint64_t call) {
  std::array<uint32_t, 4> out{};
  philox::block_words(block, seed, call, out.data());
  return out;
}

uint32_t drop_threshold(double p) {
  TE_CHECK(p >= 0 && p < 1, "dropout probability ", p, " is not in [0, 1)");
  return static_cast<uint32_t>(std::min(std::llround(p * 4294967296.0), 4294967295LL));
}

void dropout_multipliers(const GlobalBox& box, int64_t row_begin, int64_t row_end, uint64_t seed,
                         uint64_t call, uint32_t threshold, float scale, float* out) {
  TE_CHECK(box.ndim >= 1, "dropout_multipliers: a box needs at least one dim");
  const int last = box.ndim - 1;
  const int64_t row_len = box.lengths[last];
  // Row-major strides of the global tensor.
  std::vector<int64_t> stride(static_cast<std::size_t>(box.ndim), 1);
  for (int d = last - 1; d >= 0; --d) stride[d] = stride[d + 1] * box.global_sizes[d + 1];
  const uint32_t key_lo = static_cast<uint32_t>(seed), key_hi = static_cast<uint32_t>(seed >> 32);
  const uint32_t call_lo = static_cast<uint32_t>(call), call_hi = static_cast<uint32_t>(call >> 32);

  // The box index of row_begin over the leading dims (mixed radix over the box's lengths).
  std::vector<int64_t> index(static_cast<std::size_t>(box.ndim), 0);
  int64_t rest = row_begin;
  for (int d = last - 1; d >= 0; --d) {
    index[d] = box.lengths[d] > 0 ? rest % box.lengths[d] : 0;
    rest = box.lengths[d] > 0 ? rest / box.lengths[d] : 0;
  }
  uint32_t words[4 * kLanes];
  for (int64_t row = row_begin; row < row_end; ++row, out += row_len) {
    int64_t g0 = box.offsets[last];
    for (int d = 0; d < last; ++d) g0 += (box.offsets[d] + index[d]) * stride[d];
    // Elements [g0, g0 + row_len) of the global numbering, in groups of 4 * kLanes words.
    int64_t j = 0;
    while (j < row_len) {
      const uint64_t g = static_cast<uint64_t>(g0 + j);
      const uint64_t first_block = g / 4;
      philox_lanes(first_block, call_lo, call_hi, key_lo, key_hi, words);
      const int64_t skip = static_cast<int64_t>(g % 4);
      const int64_t n = std::min<int64_t>(4 * kLanes - skip, row_len - j);
      const uint32_t* w = words + skip;
      float* o = out + j;
      for (int64_t i = 0; i < n; ++i) o[i] = w[i] >= threshold ? scale : 0.0f;
      j += n;
    }
    for (int d = last - 1; d >= 0; --d) {
      if (++index[d] < box.lengths[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace te::kernels
