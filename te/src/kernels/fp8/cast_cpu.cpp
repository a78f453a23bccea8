// CPU FP8 conversions: integer rounding on the float's bits, so every case (subnormals, ties,
// saturation) is exact and the loops vectorise.

#include <cmath>
#include <cstring>

#include "te/kernels/fp8_cast.h"

namespace te::fp8 {

namespace {

struct Format {
  int mantissa_bits;
  int bias;
  uint32_t max_code;  // largest finite magnitude's bit pattern
};

constexpr Format format_of(DType t) {
  return t == DType::kE4M3 ? Format{3, 7, 0x7E} : Format{2, 15, 0x7B};
}

inline uint8_t encode(float value, Format f) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t exp8 = (bits >> 23) & 0xFFu;
  const uint32_t mant23 = bits & 0x7FFFFFu;
  if (exp8 == 0xFF && mant23 != 0) return 0x7F;  // NaN (sign dropped, as cuda_fp8.h does)
  if (exp8 == 0xFF) return static_cast<uint8_t>(sign | f.max_code);  // +-inf saturates
  if (exp8 == 0) return static_cast<uint8_t>(sign);  // zero and float subnormals round to 0
  const int e = static_cast<int>(exp8) - 127;
  const uint32_t m = mant23 | 0x800000u;  // 24 significant bits
  const int min_normal = 1 - f.bias;
  // Bits of m below the kept ones: the mantissa width for normals, more for subnormals.
  int shift = 23 - f.mantissa_bits + (e < min_normal ? min_normal - e : 0);
  if (shift > 24) return static_cast<uint8_t>(sign);  // below half the smallest subnormal
  uint32_t keep = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (keep & 1u))) ++keep;
  uint32_t code;
  if (e < min_normal) {
    code = keep;  // a carry into bit mantissa_bits lands on the smallest normal exactly
  } else {
    int biased = e + f.bias;
    if (keep >> (f.mantissa_bits + 1)) {  // rounding carried out of the mantissa
      keep >>= 1;
      ++biased;
    }
    if (biased >= (1 << (7 - f.mantissa_bits))) return static_cast<uint8_t>(sign | f.max_code);
    code = (static_cast<uint32_t>(biased) << f.mantissa_bits) |
           (keep & ((1u << f.mantissa_bits) - 1u));
  }
  if (code > f.max_code) code = f.max_code;
  return static_cast<uint8_t>(sign | code);
}

}  // namespace

uint8_t cast_to_fp8(float value, DType type) { return encode(value, format_of(type)); }

float cast_from_fp8(uint8_t bits, DType type) {
  const Format f = format_of(type);
  const bool negative = bits & 0x80u;
  const int exp_bits = 7 - f.mantissa_bits;
  const uint32_t exponent = (bits >> f.mantissa_bits) & ((1u << exp_bits) - 1u);
  const uint32_t mantissa = bits & ((1u << f.mantissa_bits) - 1u);
  float magnitude;
  if (type == DType::kE4M3 && exponent == 15 && mantissa == 7) {
    return std::nanf("");
  } else if (type == DType::kE5M2 && exponent == 31) {
    if (mantissa != 0) return std::nanf("");
    magnitude = INFINITY;
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), 1 - f.bias - f.mantissa_bits);
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa + (1u << f.mantissa_bits)),
                           static_cast<int>(exponent) - f.bias - f.mantissa_bits);
  }
  return negative ? -magnitude : magnitude;
}

float quantize(const float* in, uint8_t* out, int64_t n, float scale, DType type) {
  const Format f = format_of(type);
  float amax = 0.0f;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    const float a = std::fabs(in[i]);
    nan = nan || a != a;
    amax = a > amax ? a : amax;
    out[i] = encode(in[i] * scale, f);
  }
  return nan ? std::nanf("") : amax;
}

void dequantize(const uint8_t* in, float* out, int64_t n, float scale_inv, DType type) {
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = cast_from_fp8(static_cast<uint8_t>(c), type);
  for (int64_t i = 0; i < n; ++i) out[i] = table[in[i]] * scale_inv;
}

}  // namespace te::fp8
