#pragma once

// The bit pattern of an fp32 value and back (the FP8 tests reason about bits), and how far an
// FP8 tensor-core GEMM may be from the exact one.

#include <cmath>
#include <cstdint>
#include <cstring>

namespace te::fp8::test {

inline float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}

inline uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

/// The largest |error| of one output of an FP8 tensor-core GEMM over `k` products whose absolute
/// values sum to `abs_sum`, against the exact sum. Hopper's FP8 MMA accumulates with about 13
/// mantissa bits, not fp32's 23 (DeepSeek-V3 report, section 3.3.2), and cuBLASLt's fast
/// accumulation keeps that accumulator across the whole reduction. Summing k terms in a
/// t-bit accumulator that may truncate errs by at most (k - 1) * 2^-t of the sum of |terms|
/// (first-order bound of recursive summation), with t = 13; one more rounding of the fp32 output.
inline double fp8_tensor_core_gemm_bound(int64_t k, double abs_sum) {
  return (static_cast<double>(k - 1) * std::ldexp(1.0, -13) + std::ldexp(1.0, -24)) * abs_sum +
         1e-30;
}

}  // namespace te::fp8::test
