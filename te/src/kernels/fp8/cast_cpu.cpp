// CPU FP8 conversions: integer rounding on the float's bits, so every case (subnormals, ties,
// saturation) is exact and the loops vectorise.

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "te/error.h"

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

// The vector loops are inlined into one function per instruction set, so each compiles them
// for its own.
#if defined(__GNUC__)
#define TE_INLINE inline __attribute__((always_inline))
#else
#define TE_INLINE inline
#endif

// Branch-free encode for the quantize loop, with the same results as encode(). Normal results
// round on the integer bits (add half a quantum minus one, plus the lowest kept bit: ties go to
// even); subnormal results come from the float unit, which rounds |x| + 2^k to nearest-even when
// 2^k's quantum is the format's smallest subnormal, leaving the code in the low bits. Only
// integer ops, one float add and selects: the loop compiles to SIMD.
template <int kMantissa, int kBias, uint32_t kMaxCode>
TE_INLINE uint8_t encode_fast(uint32_t bits) {
  constexpr uint32_t kShift = 23 - kMantissa;
  constexpr uint32_t kRebias = static_cast<uint32_t>(127 - kBias) << kMantissa;
  constexpr uint32_t kMinNormalBits = static_cast<uint32_t>(127 + 1 - kBias) << 23;
  constexpr uint32_t kMagicBits = static_cast<uint32_t>(127 - kBias + kShift + 1) << 23;
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  const uint32_t rounded = abs_bits + ((1u << (kShift - 1)) - 1u) + ((abs_bits >> kShift) & 1u);
  const uint32_t normal = (rounded >> kShift) - kRebias;  // wraps below the normals: unused there
  float a, magic, sum;
  std::memcpy(&a, &abs_bits, sizeof a);
  std::memcpy(&magic, &kMagicBits, sizeof magic);
  sum = a + magic;
  uint32_t sum_bits;
  std::memcpy(&sum_bits, &sum, sizeof sum_bits);
  const uint32_t sub = sum_bits - kMagicBits;
  uint32_t code = abs_bits < kMinNormalBits ? sub : normal;
  code = code > kMaxCode ? kMaxCode : code;  // past the largest finite, infinities included
  return static_cast<uint8_t>(abs_bits > 0x7F800000u ? 0x7Fu : (sign | code));  // NaN
}

// One pass: the codes of in[i] * scale, and max |in[i]| as the largest magnitude bit pattern
// (integer order is float order for |x|; a NaN sorts above +inf and comes out as NaN).
// Inlined into one function per instruction set below, each compiled for its own.
template <int kMantissa, int kBias, uint32_t kMaxCode>
TE_INLINE float quantize_loop(const float* __restrict in, uint8_t* __restrict out, int64_t n,
                              float scale) {
  uint32_t top = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b;
    std::memcpy(&b, &in[i], sizeof b);
    const uint32_t abs_bits = b & 0x7FFFFFFFu;
    top = abs_bits > top ? abs_bits : top;
    const float scaled = in[i] * scale;
    uint32_t sb;
    std::memcpy(&sb, &scaled, sizeof sb);
    out[i] = encode_fast<kMantissa, kBias, kMaxCode>(sb);
  }
  float amax;
  std::memcpy(&amax, &top, sizeof amax);
  return amax;
}

TE_INLINE void dequantize_loop(const uint8_t* __restrict in, float* __restrict out, int64_t n,
                               const float* __restrict table) {
  for (int64_t i = 0; i < n; ++i) out[i] = table[in[i]];
}

using QuantizeFn = float (*)(const float*, uint8_t*, int64_t, float);
using DequantizeFn = void (*)(const uint8_t*, float*, int64_t, const float*);

// The loops for one instruction set (a GCC target attribute; empty for the baseline).
#define TE_KERNELS_FOR(suffix, target)                                                        \
  target float quantize_e4m3_##suffix(const float* in, uint8_t* out, int64_t n, float s) {    \
    return quantize_loop<3, 7, 0x7E>(in, out, n, s);                                          \
  }                                                                                           \
  target float quantize_e5m2_##suffix(const float* in, uint8_t* out, int64_t n, float s) {    \
    return quantize_loop<2, 15, 0x7B>(in, out, n, s);                                         \
  }                                                                                           \
  target void dequantize_##suffix(const uint8_t* in, float* out, int64_t n, const float* t) { \
    dequantize_loop(in, out, n, t);                                                           \
  }

struct Kernels {
  QuantizeFn e4m3;
  QuantizeFn e5m2;
  DequantizeFn dequantize;
  const char* isa;
};

TE_KERNELS_FOR(base, )

#if defined(__GNUC__) && defined(__x86_64__)
// AVX-512 with byte and word ops (BW) narrows 16 codes per instruction: about 2x AVX2 here.
TE_KERNELS_FOR(avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq"))))
TE_KERNELS_FOR(avx2, __attribute__((target("avx2,fma"))))
#endif

// The best set this CPU runs, or the one TE_FP8_ISA names (avx512, avx2, baseline: for tests
// and comparisons). Chosen once; read-only afterwards.
const Kernels& kernels() {
  static const Kernels chosen = [] {
    const Kernels base{quantize_e4m3_base, quantize_e5m2_base, dequantize_base, "baseline"};
    std::vector<Kernels> runnable;  // best first
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq")) {
      runnable.push_back({quantize_e4m3_avx512, quantize_e5m2_avx512, dequantize_avx512, "avx512"});
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      runnable.push_back({quantize_e4m3_avx2, quantize_e5m2_avx2, dequantize_avx2, "avx2"});
    }
#endif
    runnable.push_back(base);
    const char* wanted = std::getenv("TE_FP8_ISA");
    if (wanted == nullptr || *wanted == '\0') return runnable.front();
    std::string names;
    for (const Kernels& k : runnable) {
      if (std::strcmp(k.isa, wanted) == 0) return k;
      names += names.empty() ? k.isa : std::string(", ") + k.isa;
    }
    TE_FAIL("TE_FP8_ISA=", wanted, " is not an instruction set this CPU runs the FP8 casts with; ",
            "use one of ", names, " or unset it");
  }();
  return chosen;
}

}  // namespace

float quantize(const float* in, uint8_t* out, int64_t n, float scale, DType type) {
  const Kernels& k = kernels();
  return type == DType::kE4M3 ? k.e4m3(in, out, n, scale) : k.e5m2(in, out, n, scale);
}

const char* kernel_isa() { return kernels().isa; }

void dequantize(const uint8_t* in, float* out, int64_t n, float scale_inv, DType type) {
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = cast_from_fp8(static_cast<uint8_t>(c), type) * scale_inv;
  kernels().dequantize(in, out, n, table);
}

}  // namespace te::fp8
