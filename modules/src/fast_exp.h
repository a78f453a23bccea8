#pragma once

// exp for the vectorised loops of te::nn's CPU kernels (the tanh gelu, fused attention's
// softmax): inlined into each instruction-set clone of the loop that calls it. Internal.

#include <cmath>
#include <cstdint>
#include <cstring>

namespace te::nn::functional::detail {

constexpr float kExpLow = -87.33654475f;  // log(FLT_MIN): below it, exp counts as 0
// 1.5 2^23 + 127: w / ln 2 + kShift rounds to the integer kShift + n, whose low mantissa bits hold
// n + 127, 2^n's exponent field.
constexpr float kShift = 12582912.f + 127.f;
constexpr float kLog2e = 1.44269504088896341f;  // 1 / ln 2
constexpr float kLn2Hi = 0.693359375f;          // ln 2 = kLn2Hi + kLn2Lo (Cephes' expf)
constexpr float kLn2Lo = -2.12194440e-4f;

// exp(v) for v <= 0, branch-free so that the loops vectorise; 0 below log(FLT_MIN) and for NaN.
// Cephes' expf reduction, v = n ln 2 + r with |r| <= ln 2 / 2, and e^r = 1 + r + r^2 q(r), q of
// degree 4 fitted for the least maximum relative error (4e-9, under fp32's rounding). (Small
// positive v, as rounding leaves after subtracting a row's maximum, take the same path.)
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
inline float
exp_nonpositive(float v) {
  const bool normal = std::isgreaterequal(v, kExpLow);  // (quiet compares if-convert)
  const float w = normal ? v : 0.f;
  const float t = w * kLog2e + kShift;
  const float n = t - kShift;
  const float r = (w - n * kLn2Hi) - n * kLn2Lo;
  // (Estrin's scheme: a shorter dependency chain than Horner's)
  const float r2 = r * r;
  const float q0 = 1.66665211e-1f * r + 4.99999940e-1f;
  const float q1 = 8.36871006e-3f * r + 4.16683890e-2f;
  const float q = (1.38145999e-3f * r2 + q1) * r2 + q0;
  const float er = q * r2 + r + 1.f;
  uint32_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  bits <<= 23;  // 2^n (n + 127 is in [1, 127])
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const float value = er * scale;  // (computed either way: a select, not a branch)
  return normal ? value : 0.f;
}

}  // namespace te::nn::functional::detail
