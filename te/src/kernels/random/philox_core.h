#pragma once

// Philox 4x32-10's rounds and te's element-to-word mapping, written once for the CPU and the
// CUDA dropout kernels (host and device functions), so both draw the same mask bit for bit.

#include <cstdint>

#ifdef __CUDACC__
#define TE_PHILOX_FN __host__ __device__ __forceinline__
#else
#define TE_PHILOX_FN inline
#endif

namespace te::kernels::philox {

constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;    // round multipliers
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;  // key schedule increments
constexpr int kRounds = 10;

/// One round on the counter (x0..x3) under the round key (k0, k1).
TE_PHILOX_FN void round(uint32_t& x0, uint32_t& x1, uint32_t& x2, uint32_t& x3, uint32_t k0,
                        uint32_t k1) {
  const uint64_t p0 = static_cast<uint64_t>(kMul0) * x0;
  const uint64_t p1 = static_cast<uint64_t>(kMul1) * x2;
  const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ x1 ^ k0;
  const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ x3 ^ k1;
  x1 = static_cast<uint32_t>(p1);
  x3 = static_cast<uint32_t>(p0);
  x0 = n0;
  x2 = n2;
}

/// The 4 words of the block at counter (block, call) under `seed`: elements 4 block .. 4 block + 3
/// of a global tensor take them in order.
TE_PHILOX_FN void block_words(uint64_t block, uint64_t seed, uint64_t call, uint32_t out[4]) {
  uint32_t x0 = static_cast<uint32_t>(block), x1 = static_cast<uint32_t>(block >> 32);
  uint32_t x2 = static_cast<uint32_t>(call), x3 = static_cast<uint32_t>(call >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < kRounds; ++r) {
    round(x0, x1, x2, x3, k0, k1);
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  out[0] = x0;
  out[1] = x1;
  out[2] = x2;
  out[3] = x3;
}

/// The 32-bit word of element g of a global tensor in random call `call` under `seed`: lane
/// g % 4 of the block at counter (g / 4, call).
TE_PHILOX_FN uint32_t word_of(uint64_t g, uint64_t seed, uint64_t call) {
  uint32_t words[4];
  block_words(g / 4, seed, call, words);
  return words[g % 4];
}

}  // namespace te::kernels::philox
