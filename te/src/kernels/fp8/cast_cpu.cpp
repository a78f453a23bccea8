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

namespace {

// Branch-free encode for the quantize loop, with the same results as encode(): the float unit
// rounds to nearest-even by adding and removing 2^(quantum exponent + 23), after which the value
// is an FP8 value (or beyond the largest) whose bits are read off directly. Compiles to SIMD.
template <int kMantissa, int kBias, uint32_t kMaxCode>
inline uint8_t encode_fast(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  constexpr int32_t kMinNormal = 1 - kBias;
  // Exponent of the quantum at this magnitude: max(e, min normal) - mantissa bits.
  const int32_t e = static_cast<int32_t>(abs_bits >> 23) - 127;
  const int32_t q = (e > kMinNormal ? e : kMinNormal) - kMantissa;
  float magic;
  const uint32_t magic_bits = static_cast<uint32_t>(q + 23 + 127) << 23;
  std::memcpy(&magic, &magic_bits, sizeof magic);
  float a;
  std::memcpy(&a, &abs_bits, sizeof a);
  const float r = (a + magic) - magic;  // rounded to the quantum, ties to even
  uint32_t rb;
  std::memcpy(&rb, &r, sizeof rb);
  const int32_t re = static_cast<int32_t>(rb >> 23) - 127;
  // Subnormal: r / smallest subnormal; normal: biased exponent and top mantissa bits.
  const uint32_t sub = static_cast<uint32_t>(
      static_cast<int32_t>(r * static_cast<float>(1 << (kMantissa - kMinNormal))));
  const uint32_t normal = (static_cast<uint32_t>(re + kBias) << kMantissa) |
                          ((rb >> (23 - kMantissa)) & ((1u << kMantissa) - 1u));
  // Plain selects, so the loop stays free of branches.
  const bool subnormal = re < kMinNormal;
  uint32_t code = subnormal ? sub : normal;
  code = re + kBias >= (1 << (7 - kMantissa)) ? kMaxCode : code;  // exponent overflow
  code = code > kMaxCode ? kMaxCode : code;                         // past the largest
  code = abs_bits >= 0x7F800000u ? kMaxCode : code;                 // infinities
  code = e < -126 ? 0u : code;  // zeros and float subnormals
  const uint32_t out = abs_bits > 0x7F800000u ? 0x7Fu : (sign | code);  // NaN
  return static_cast<uint8_t>(out);
}

template <int kMantissa, int kBias, uint32_t kMaxCode>
void quantize_loop(const float* in, uint8_t* out, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) out[i] = encode_fast<kMantissa, kBias, kMaxCode>(in[i] * scale);
}

// max |x| as the largest magnitude bit pattern: integer order is float order for |x|, the loop
// vectorises, and a NaN (above +inf's pattern) comes out as NaN.
float abs_max(const float* in, int64_t n) {
  uint32_t top = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &in[i], sizeof b);
    b &= 0x7FFFFFFFu;
    top = b > top ? b : top;
  }
  float amax;
  std::memcpy(&amax, &top, sizeof amax);
  return amax;
}

}  // namespace

float quantize(const float* in, uint8_t* out, int64_t n, float scale, DType type) {
  if (type == DType::kE4M3) {
    quantize_loop<3, 7, 0x7E>(in, out, n, scale);
  } else {
    quantize_loop<2, 15, 0x7B>(in, out, n, scale);
  }
  return abs_max(in, n);
}

void dequantize(const uint8_t* in, float* out, int64_t n, float scale_inv, DType type) {
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = cast_from_fp8(static_cast<uint8_t>(c), type);
  for (int64_t i = 0; i < n; ++i) out[i] = table[in[i]] * scale_inv;
}

}  // namespace te::fp8
