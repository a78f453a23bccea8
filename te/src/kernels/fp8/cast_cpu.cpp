// CPU FP8 conversions: integer rounding on the float's bits, so every case (subnormals, ties,
// saturation) is exact and the loops vectorise.

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "te/error.h"

#include "te/kernels/fp4_cast.h"
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
// integer ops, one float add and selects: the loop compiles to SIMD. The code comes in a 32-bit
// word (encode_code), so a loop over a short block stays in 32-bit lanes at full vector width
// and narrows to bytes after; encode_fast is the byte.
template <int kMantissa, int kBias, uint32_t kMaxCode>
TE_INLINE uint32_t encode_code(uint32_t bits) {
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
  return abs_bits > 0x7F800000u ? 0x7Fu : (sign | code);  // NaN
}

template <int kMantissa, int kBias, uint32_t kMaxCode>
TE_INLINE uint8_t encode_fast(uint32_t bits) {
  return static_cast<uint8_t>(encode_code<kMantissa, kBias, kMaxCode>(bits));
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

// max(amax, |x[i]|) on the magnitudes' bit patterns, NaN patterns (above inf) dropped: an integer
// max reduction, which compilers vectorize where a float one would need -ffast-math.
TE_INLINE float fold_amax_loop(const float* __restrict x, int64_t n, float amax) {
  int32_t top;  // signed: magnitudes' patterns are below 2^31, and a signed max vectorizes
  std::memcpy(&top, &amax, sizeof top);
  for (int64_t i = 0; i < n; ++i) {
    int32_t bits;
    std::memcpy(&bits, &x[i], sizeof bits);
    bits &= 0x7FFFFFFF;
    bits = bits <= 0x7F800000 ? bits : 0;
    top = top > bits ? top : bits;
  }
  std::memcpy(&amax, &top, sizeof amax);
  return amax;
}

// The block loops take the recipes' widths (16, 32, 128) as constants, so a whole block's inner
// loop unrolls into whole vectors; a ragged last block, and other widths, take the general loop.
template <int64_t kWidth>
TE_INLINE void fold_blocks_fixed(const float* __restrict in, int64_t n, int64_t width,
                                 float* __restrict amax) {
  const int64_t w = kWidth > 0 ? kWidth : width;
  int64_t c0 = 0, b = 0;
  for (; c0 + w <= n; c0 += w, ++b) amax[b] = fold_amax_loop(in + c0, w, amax[b]);
  if (c0 < n) amax[b] = fold_amax_loop(in + c0, n - c0, amax[b]);
}

TE_INLINE void fold_blocks_loop(const float* __restrict in, int64_t n, int64_t width,
                                float* __restrict amax) {
  if (width == 16) return fold_blocks_fixed<16>(in, n, width, amax);
  if (width == 32) return fold_blocks_fixed<32>(in, n, width, amax);
  if (width == 128) return fold_blocks_fixed<128>(in, n, width, amax);
  fold_blocks_fixed<0>(in, n, width, amax);
}

// The codes of len elements times s, in chunks: each element's code as a 32-bit word (so a short
// block's loop stays in 32-bit lanes at full vector width), then the chunk narrowed to bytes.
template <int kMantissa, int kBias, uint32_t kMaxCode>
TE_INLINE void quantize_span(const float* __restrict x, uint8_t* __restrict y, int64_t len,
                             float s) {
  constexpr int64_t kChunk = 128;
  alignas(64) uint32_t codes[kChunk];
  for (int64_t c0 = 0; c0 < len; c0 += kChunk) {
    const int64_t m = len - c0 < kChunk ? len - c0 : kChunk;
    for (int64_t i = 0; i < m; ++i) {
      const float scaled = x[c0 + i] * s;
      uint32_t sb;
      std::memcpy(&sb, &scaled, sizeof sb);
      codes[i] = encode_code<kMantissa, kBias, kMaxCode>(sb);
    }
    for (int64_t i = 0; i < m; ++i) y[c0 + i] = static_cast<uint8_t>(codes[i]);
  }
}

template <int64_t kWidth, int kMantissa, int kBias, uint32_t kMaxCode>
TE_INLINE void quantize_blocks_fixed(const float* __restrict in, uint8_t* __restrict out, int64_t n,
                                     int64_t width, const float* __restrict scale) {
  const int64_t w = kWidth > 0 ? kWidth : width;
  int64_t c0 = 0, b = 0;
  for (; c0 + w <= n; c0 += w, ++b) {
    quantize_span<kMantissa, kBias, kMaxCode>(in + c0, out + c0, w, scale[b]);
  }
  if (c0 < n) quantize_span<kMantissa, kBias, kMaxCode>(in + c0, out + c0, n - c0, scale[b]);
}

template <int kMantissa, int kBias, uint32_t kMaxCode>
TE_INLINE void quantize_blocks_loop(const float* __restrict in, uint8_t* __restrict out, int64_t n,
                                    int64_t width, const float* __restrict scale) {
  if (width == 16)
    return quantize_blocks_fixed<16, kMantissa, kBias, kMaxCode>(in, out, n, 16, scale);
  if (width == 32)
    return quantize_blocks_fixed<32, kMantissa, kBias, kMaxCode>(in, out, n, 32, scale);
  if (width == 128) {
    return quantize_blocks_fixed<128, kMantissa, kBias, kMaxCode>(in, out, n, 128, scale);
  }
  quantize_blocks_fixed<0, kMantissa, kBias, kMaxCode>(in, out, n, width, scale);
}

// The value of a non-negative E4M3 code below NaN: m * 2^-9 for the subnormals, else the float
// whose exponent is the code's rebiased and whose mantissa is its 3 bits. Branch-free.
TE_INLINE float e4m3_positive_value(uint32_t code) {
  const uint32_t e = code >> 3, m = code & 7u;
  const uint32_t normal_bits = ((e + 120u) << 23) | (m << 20);
  float normal;
  std::memcpy(&normal, &normal_bits, sizeof normal);
  return e == 0 ? static_cast<float>(m) * 0x1p-9f : normal;
}

TE_INLINE void nvfp4_scales_loop(const float* __restrict amax, int64_t nb, float block_factor,
                                 float s_dec, uint8_t* __restrict scale, float* __restrict encode) {
  for (int64_t b = 0; b < nb; ++b) {
    float v = amax[b] * block_factor;
    v = v < FLT_MAX ? v : FLT_MAX;  // fminf (a NaN gives FLT_MAX)
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    const uint8_t code = encode_fast<3, 7, 0x7E>(bits);
    scale[b] = code;
    const float e = 1.0f / (e4m3_positive_value(code) * s_dec);
    encode[b] = e < FLT_MAX ? e : FLT_MAX;
  }
}

// A chunk of whole blocks at a time: every element's code as a 32-bit word (a block is one
// vector of 16 floats, and the codes stay in 32-bit lanes, so the loop vectorizes at full width),
// then the codes packed two a byte: a pair of words read as one 64-bit word w (the even element's
// code in its low bits, the odd one's from bit 32) packs as the low byte of w | (w >> 28).
TE_INLINE void nvfp4_row_loop(const float* __restrict in, uint8_t* __restrict packed, int64_t n,
                              const float* __restrict encode) {
  constexpr int64_t kChunk = 256;
  alignas(64) uint32_t codes[kChunk];
  uint64_t pairs[kChunk / 2];
  static_assert(sizeof pairs == sizeof codes, "two codes a pair");
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the pairs read little-endian");
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t len = n - c0 < kChunk ? n - c0 : kChunk;
    int64_t i = 0;
    for (; i + 16 <= len; i += 16) {
      const float s = encode[(c0 + i) / 16];
      const float* __restrict x = in + c0 + i;
      for (int j = 0; j < 16; ++j) codes[i + j] = e2m1_code(x[j] * s);
    }
    for (; i < len; ++i) codes[i] = e2m1_code(in[c0 + i] * encode[(c0 + i) / 16]);
    std::memcpy(pairs, codes, static_cast<std::size_t>(len / 2) * sizeof(uint64_t));
    uint8_t* __restrict y = packed + c0 / 2;
    for (int64_t j = 0; j < len / 2; ++j) y[j] = static_cast<uint8_t>(pairs[j] | (pairs[j] >> 28));
  }
}

TE_INLINE void dequantize_loop(const uint8_t* __restrict in, float* __restrict out, int64_t n,
                               const float* __restrict table) {
  for (int64_t i = 0; i < n; ++i) out[i] = table[in[i]];
}

using QuantizeFn = float (*)(const float*, uint8_t*, int64_t, float);
using DequantizeFn = void (*)(const uint8_t*, float*, int64_t, const float*);
using FoldFn = float (*)(const float*, int64_t, float);
using FoldBlocksFn = void (*)(const float*, int64_t, int64_t, float*);
using QuantizeBlocksFn = void (*)(const float*, uint8_t*, int64_t, int64_t, const float*);
using Nvfp4ScalesFn = void (*)(const float*, int64_t, float, float, uint8_t*, float*);
using Nvfp4RowFn = void (*)(const float*, uint8_t*, int64_t, const float*);

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
  }                                                                                           \
  target float fold_##suffix(const float* x, int64_t n, float amax) {                         \
    return fold_amax_loop(x, n, amax);                                                        \
  }                                                                                           \
  target void fold_blocks_##suffix(const float* x, int64_t n, int64_t w, float* amax) {       \
    fold_blocks_loop(x, n, w, amax);                                                          \
  }                                                                                           \
  target void blocks_e4m3_##suffix(const float* x, uint8_t* y, int64_t n, int64_t w,          \
                                   const float* s) {                                          \
    quantize_blocks_loop<3, 7, 0x7E>(x, y, n, w, s);                                          \
  }                                                                                           \
  target void blocks_e5m2_##suffix(const float* x, uint8_t* y, int64_t n, int64_t w,          \
                                   const float* s) {                                          \
    quantize_blocks_loop<2, 15, 0x7B>(x, y, n, w, s);                                         \
  }                                                                                           \
  target void nvfp4_scales_##suffix(const float* a, int64_t nb, float f, float d, uint8_t* s, \
                                    float* e) {                                               \
    nvfp4_scales_loop(a, nb, f, d, s, e);                                                     \
  }                                                                                           \
  target void nvfp4_row_##suffix(const float* x, uint8_t* y, int64_t n, const float* e) {     \
    nvfp4_row_loop(x, y, n, e);                                                               \
  }

struct Kernels {
  QuantizeFn e4m3;
  QuantizeFn e5m2;
  DequantizeFn dequantize;
  FoldFn fold;
  FoldBlocksFn fold_blocks;
  QuantizeBlocksFn blocks_e4m3;
  QuantizeBlocksFn blocks_e5m2;
  Nvfp4ScalesFn nvfp4_scales;
  Nvfp4RowFn nvfp4_row;
  const char* isa;
};

#define TE_KERNEL_SET(suffix, name)                                                              \
  Kernels {                                                                                      \
    quantize_e4m3_##suffix, quantize_e5m2_##suffix, dequantize_##suffix, fold_##suffix,          \
        fold_blocks_##suffix, blocks_e4m3_##suffix, blocks_e5m2_##suffix, nvfp4_scales_##suffix, \
        nvfp4_row_##suffix, name                                                                 \
  }

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
    const Kernels base = TE_KERNEL_SET(base, "baseline");
    std::vector<Kernels> runnable;  // best first
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq")) {
      runnable.push_back(TE_KERNEL_SET(avx512, "avx512"));
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      runnable.push_back(TE_KERNEL_SET(avx2, "avx2"));
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

float fold_amax(const float* x, int64_t n, float amax) { return kernels().fold(x, n, amax); }

void fold_block_amaxes(const float* in, int64_t n, int64_t width, float* amax) {
  kernels().fold_blocks(in, n, width, amax);
}

void nvfp4_block_scales(const float* amax, int64_t nb, float block_factor, float s_dec,
                        uint8_t* scale, float* encode) {
  kernels().nvfp4_scales(amax, nb, block_factor, s_dec, scale, encode);
}

void nvfp4_quantize_row(const float* in, uint8_t* packed, int64_t n, const float* encode) {
  kernels().nvfp4_row(in, packed, n, encode);
}

void quantize_blocks_row(const float* in, uint8_t* out, int64_t n, int64_t width,
                         const float* scale, DType type) {
  const Kernels& k = kernels();
  (type == DType::kE4M3 ? k.blocks_e4m3 : k.blocks_e5m2)(in, out, n, width, scale);
}

void dequantize(const uint8_t* in, float* out, int64_t n, float scale_inv, DType type) {
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = cast_from_fp8(static_cast<uint8_t>(c), type) * scale_inv;
  kernels().dequantize(in, out, n, table);
}

}  // namespace te::fp8
