#pragma once

// The inline pieces of te::nn's CPU kernels' loops: bfloat16 <-> float32 by their bits, and a dot
// product over 16 partial sums. Inlined into each instruction-set clone of the loop that calls
// them, so they vectorise there. Internal.

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <cstring>

namespace te::nn::functional::detail {

#if defined(__GNUC__)
#define TE_LOOP_INLINE __attribute__((always_inline)) inline
#else
#define TE_LOOP_INLINE inline
#endif

TE_LOOP_INLINE float bf16_to_float(at::BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even, NaN to the canonical NaN: c10::BFloat16(float)'s rounding.
TE_LOOP_INLINE void float_to_bf16(at::BFloat16* out, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  out->x = v != v ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

// sum_i a[i] * b[i] over 16 independent partial sums (so the loop vectorises without
// reassociating one sum), then the tail, then the partial sums in order.
TE_LOOP_INLINE float dot16(const float* a, const float* b, int64_t n) {
  float part[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int u = 0; u < 16; ++u) part[u] += a[i + u] * b[i + u];
  }
  float sum = 0.f;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (const float p : part) sum += p;
  return sum;
}

}  // namespace te::nn::functional::detail
