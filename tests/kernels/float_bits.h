#pragma once

// The bit pattern of an fp32 value and back (the FP8 tests reason about bits).

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

}  // namespace te::fp8::test
