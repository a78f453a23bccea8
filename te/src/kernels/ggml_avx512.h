#pragma once

// ggml's block types in AVX-512 intrinsics (internal to te::ggml: ggml.cpp includes it alone and
// calls it where the CPU has AVX-512 F, BW and VL; built with -ffp-contract=off).
//
// Each block is read as groups of 16 values: 16 small integers in the bytes of one SSE register
// (each byte's bit field shifted out and masked, so a layout reads as ggml_blocks.h writes it:
// the same offsets and shifts), with the group's scale d and, for the types that have one, its
// offset m. A sink consumes the groups:
// - DecodeSink writes d * q (+ m, or - m for the K-quants' mins): the portable loops' values bit
//   for bit (the same integers, converted exactly, then the same float multiply and add or
//   subtract);
// - DotSink multiplies them with up to 8 inputs without writing them anywhere: per group
//   d * sum(q x) (+ m * sum(x), the inputs' sums of 16 taken once per call).
// 32 values sharing one scale come as one call with two registers.

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "ggml_blocks.h"

namespace te::ggml::avx512 {

#define TE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl")))
#define TE_AVX512_INLINE __attribute__((target("avx512f,avx512bw,avx512vl"), always_inline)) inline

using blocks::f16_at;
using blocks::kQK;

/// Whether the CPU runs these kernels.
inline bool available() {
  static const bool have = __builtin_cpu_supports("avx512f") &&
                           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return have;
}

// A type's block: values and bytes (block_shape's, as constants for the kernels' templates).
template <Type T>
constexpr int64_t kElements = (T == Type::kQ2_K || T == Type::kQ3_K || T == Type::kQ4_K ||
                               T == Type::kQ5_K || T == Type::kQ6_K || T == Type::kIQ4_XS)
                                  ? kQK
                                  : 32;
template <Type T>
constexpr int64_t kBytes = T == Type::kQ8_0     ? 34
                           : T == Type::kQ4_0   ? 18
                           : T == Type::kQ4_1   ? 20
                           : T == Type::kQ5_0   ? 22
                           : T == Type::kQ5_1   ? 24
                           : T == Type::kIQ4_NL ? 18
                           : T == Type::kQ2_K   ? 84
                           : T == Type::kQ3_K   ? 110
                           : T == Type::kQ4_K   ? 144
                           : T == Type::kQ5_K   ? 176
                           : T == Type::kQ6_K   ? 210
                           : T == Type::kMXFP4  ? 17
                                                : 136;  // IQ4_XS
// Whether a value is d * q + m, or d * q - m (kMin), else d * q.
template <Type T>
constexpr bool kMin = T == Type::kQ2_K || T == Type::kQ4_K || T == Type::kQ5_K;
template <Type T>
constexpr bool kOffset = T == Type::kQ4_1 || T == Type::kQ5_1 || kMin<T>;

TE_AVX512_INLINE __m128i load16(const unsigned char* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// (v >> shift) & mask in each byte (shift < 8; the mask keeps only bits of the byte itself).
TE_AVX512_INLINE __m128i bits(__m128i v, int shift, int mask) {
  return _mm_and_si128(_mm_srli_epi16(v, shift), _mm_set1_epi8(static_cast<char>(mask)));
}

// IQ4_NL's and IQ4_XS's levels at 16 nibbles (ggml_blocks.h kIq4Values).
TE_AVX512_INLINE __m128i iq4_levels(__m128i nibbles) {
  const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks::kIq4Values));
  return _mm_shuffle_epi8(levels, nibbles);
}

// MXFP4's levels at 16 nibbles (ggml_blocks.h kMxfp4Values).
TE_AVX512_INLINE __m128i mxfp4_levels(__m128i nibbles) {
  const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks::kMxfp4Values));
  return _mm_shuffle_epi8(levels, nibbles);
}

// 16 at byte j where bit j of `mask` (16 bits) is set, else 0. (By shuffles and a compare: a
// mask register loaded from the block ran several times slower here.)
TE_AVX512_INLINE __m128i sixteen_where(uint32_t mask) {
  const __m128i spread =
      _mm_shuffle_epi8(_mm_cvtsi32_si128(static_cast<int>(mask)),
                       _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
  const __m128i bit = _mm_setr_epi8(1, 2, 4, 8, 16, 32, 64, -128, 1, 2, 4, 8, 16, 32, 64, -128);
  return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(spread, bit), bit), _mm_set1_epi8(16));
}

// 16 signed bytes as floats (exact).
TE_AVX512_INLINE __m512 to_float(__m128i q) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)); }

// groups_32 for the 4- and 5-bit ones (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL).
template <Type T, typename Sink>
TE_AVX512_INLINE void groups_small(const unsigned char* p, float d, float m, Sink& sink) {
  constexpr bool kFifth = T == Type::kQ5_0 || T == Type::kQ5_1;
  const unsigned char* h = p + (kOffset<T> ? 4 : 2);
  const __m128i v = load16(kFifth ? h + 4 : h);
  __m128i lo = bits(v, 0, 0x0F), hi = bits(v, 4, 0x0F);
  if constexpr (T == Type::kIQ4_NL) {
    lo = iq4_levels(lo), hi = iq4_levels(hi);
  }
  if constexpr (kFifth) {  // bit j of the 32 high bits: value j's fifth bit
    const uint32_t qh =
        static_cast<uint32_t>(h[0] | h[1] << 8 | h[2] << 16) | static_cast<uint32_t>(h[3]) << 24;
    lo = _mm_or_si128(lo, sixteen_where(qh & 0xFFFF));
    hi = _mm_or_si128(hi, sixteen_where(qh >> 16));
  }
  if constexpr (T == Type::kQ4_0 || T == Type::kQ5_0) {
    const __m128i zero = _mm_set1_epi8(T == Type::kQ4_0 ? 8 : 16);
    lo = _mm_sub_epi8(lo, zero), hi = _mm_sub_epi8(hi, zero);
  }
  sink(0, lo, hi, d, m);
}

// The 32-value types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4 (layouts in ggml_blocks.h
// decode_32).
template <Type T, typename Sink>
TE_AVX512_INLINE void groups_32(const float* table, const unsigned char* p, Sink& sink) {
  if constexpr (T == Type::kMXFP4) {
    const __m128i v = load16(p + 1);
    sink(0, mxfp4_levels(bits(v, 0, 0x0F)), mxfp4_levels(bits(v, 4, 0x0F)), blocks::e8m0_half(p[0]),
         0.0f);
    return;
  }
  const float d = f16_at(table, p);
  const float m = kOffset<T> ? f16_at(table, p + 2) : 0.0f;
  if constexpr (T == Type::kQ8_0) {
    sink(0, load16(p + 2), load16(p + 18), d, m);
  } else {
    groups_small<T>(p, d, m, sink);
  }
}

// 8 or 16 small integers as floats times d: a block's sub-block scales (or mins), each the same
// float multiply as the portable loops'.
TE_AVX512_INLINE void scale8(uint64_t bytes, float d, float* out) {
  const __m256 v =
      _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(bytes))));
  _mm256_storeu_ps(out, _mm256_mul_ps(_mm256_set1_ps(d), v));
}
TE_AVX512_INLINE void scale16(__m128i q, float d, float* out) {
  _mm512_storeu_ps(out, _mm512_mul_ps(_mm512_set1_ps(d), to_float(q)));
}
inline uint32_t word(const unsigned char* p) {
  uint32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

// Q2_K and Q3_K: 2-bit values (and Q3_K's third bits) in 16 sub-blocks of 16.
template <Type T, typename Sink>
TE_AVX512_INLINE void groups_low_k(const float* table, const unsigned char* p, Sink& sink) {
  const unsigned char* qs = p + (T == Type::kQ2_K ? 16 : 32);
  float scale[16], offset[16];
  if constexpr (T == Type::kQ2_K) {  // 16 bytes: low nibble the scale, high nibble the min
    const __m128i sm = load16(p);
    scale16(bits(sm, 0, 0x0F), f16_at(table, p + 80), scale);
    scale16(bits(sm, 4, 0x0F), f16_at(table, p + 82), offset);
  } else {  // sixteen 6-bit scales: low nibbles in bytes 0-7, high pairs in bytes 8-11
    const unsigned char* sc = p + 96;
    const uint32_t a0 = word(sc), a1 = word(sc + 4), h = word(sc + 8);
    const __m128i w =
        _mm_setr_epi32(static_cast<int>((a0 & 0x0F0F0F0F) | (h & 0x03030303) << 4),
                       static_cast<int>((a1 & 0x0F0F0F0F) | (h >> 2 & 0x03030303) << 4),
                       static_cast<int>((a0 >> 4 & 0x0F0F0F0F) | (h >> 4 & 0x03030303) << 4),
                       static_cast<int>((a1 >> 4 & 0x0F0F0F0F) | (h >> 6 & 0x03030303) << 4));
    const __m128i q = _mm_sub_epi8(w, _mm_set1_epi8(32));
    scale16(q, f16_at(table, p + 108), scale);
  }
#pragma GCC unroll 2
  for (int g = 0; g < 2; ++g) {
#pragma GCC unroll 2
    for (int half = 0; half < 2; ++half) {
      const __m128i q = load16(qs + g * 32 + half * 16);
      const __m128i h = load16(p + half * 16);  // Q3_K's hmask
#pragma GCC unroll 4
      for (int s = 0; s < 4; ++s) {
        const int sb = g * 8 + s * 2 + half;
        __m128i v = bits(q, 2 * s, 3);
        if constexpr (T == Type::kQ3_K) {  // a clear high bit means minus 4
          v = _mm_sub_epi8(_mm_or_si128(v, _mm_slli_epi16(bits(h, g * 4 + s, 1), 2)),
                           _mm_set1_epi8(4));
          sink(sb * 16, v, scale[sb], 0.0f);
        } else {
          sink(sb * 16, v, scale[sb], offset[sb]);
        }
      }
    }
  }
}

// Q4_K and Q5_K: 4- and 5-bit values in 8 sub-blocks of 32, 6-bit scales and mins.
template <Type T, typename Sink>
TE_AVX512_INLINE void groups_mid_k(const float* table, const unsigned char* p, Sink& sink) {
  // Twelve bytes: sub-blocks 0-3's scales and mins in bytes 0-3 and 4-7 (6 bits each), 4-7's low
  // nibbles in bytes 8-11 and high pairs in the top bits of bytes 0-7.
  const uint32_t u0 = word(p + 4), u1 = word(p + 8), u2 = word(p + 12);
  const uint64_t scales =
      (u0 & 0x3F3F3F3Fu) | uint64_t{(u2 & 0x0F0F0F0Fu) | (u0 >> 2 & 0x30303030u)} << 32;
  const uint64_t mins =
      (u1 & 0x3F3F3F3Fu) | uint64_t{(u2 >> 4 & 0x0F0F0F0Fu) | (u1 >> 2 & 0x30303030u)} << 32;
  alignas(32) float dl[8], ml[8];
  scale8(scales, f16_at(table, p), dl);
  scale8(mins, f16_at(table, p + 2), ml);
  const unsigned char* qs = p + (T == Type::kQ5_K ? 48 : 16);
  const __m128i qh_lo = load16(p + 16), qh_hi = load16(p + 32);  // Q5_K's fifth bits
#pragma GCC unroll 8
  for (int sb = 0; sb < 8; ++sb) {
    const unsigned char* q = qs + (sb / 2) * 32;
    __m128i lo = bits(load16(q), (sb % 2) * 4, 0x0F), hi = bits(load16(q + 16), (sb % 2) * 4, 0x0F);
    if constexpr (T == Type::kQ5_K) {
      lo = _mm_or_si128(lo, _mm_slli_epi16(bits(qh_lo, sb, 1), 4));
      hi = _mm_or_si128(hi, _mm_slli_epi16(bits(qh_hi, sb, 1), 4));
    }
    sink(sb * 32, lo, hi, dl[sb], ml[sb]);
  }
}

// Q6_K and IQ4_XS.
template <Type T, typename Sink>
TE_AVX512_INLINE void groups_high_k(const float* table, const unsigned char* p, Sink& sink) {
  if constexpr (T == Type::kQ6_K) {
    float scale[16];  // sixteen int8 scales
    scale16(load16(p + 192), f16_at(table, p + 208), scale);
#pragma GCC unroll 2
    for (int g = 0; g < 2; ++g) {
#pragma GCC unroll 4
      for (int part = 0; part < 4; ++part) {
#pragma GCC unroll 2
        for (int half = 0; half < 2; ++half) {
          const __m128i lo =
              bits(load16(p + g * 64 + (part % 2) * 32 + half * 16), 4 * (part / 2), 0x0F);
          const __m128i hi = bits(load16(p + 128 + g * 32 + half * 16), 2 * part, 0x03);
          const __m128i q =
              _mm_sub_epi8(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi8(32));
          sink(g * 128 + part * 32 + half * 16, q, scale[g * 8 + part * 2 + half], 0.0f);
        }
      }
    }
  } else {  // IQ4_XS: eight 6-bit scales, low nibbles in bytes 4-7, high pairs in bytes 2-3
    const uint32_t low = word(p + 4), high = p[2] | p[3] << 8;
    uint64_t ls = 0;
    for (int ib = 0; ib < 8; ++ib) {
      ls |= uint64_t{(low >> (4 * ib) & 0x0F) | (high >> (2 * ib) & 0x03) << 4} << (8 * ib);
    }
    alignas(32) float dl[8];
    const __m256i q = _mm256_sub_epi32(
        _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(ls))), _mm256_set1_epi32(32));
    _mm256_storeu_ps(dl, _mm256_mul_ps(_mm256_set1_ps(f16_at(table, p)), _mm256_cvtepi32_ps(q)));
#pragma GCC unroll 8
    for (int ib = 0; ib < 8; ++ib) {
      const __m128i v = load16(p + 8 + ib * 16);
      sink(ib * 32, iq4_levels(bits(v, 0, 0x0F)), iq4_levels(bits(v, 4, 0x0F)), dl[ib], 0.0f);
    }
  }
}

// One block of type T at p, as groups to `sink`.
template <Type T, typename Sink>
TE_AVX512_INLINE void groups(const float* table, const unsigned char* p, Sink& sink) {
  if constexpr (T == Type::kQ2_K || T == Type::kQ3_K) {
    groups_low_k<T>(table, p, sink);
  } else if constexpr (T == Type::kQ4_K || T == Type::kQ5_K) {
    groups_mid_k<T>(table, p, sink);
  } else if constexpr (T == Type::kQ6_K || T == Type::kIQ4_XS) {
    groups_high_k<T>(table, p, sink);
  } else {
    groups_32<T>(table, p, sink);
  }
}

// Writes a block's values (d * q, then + m or - m where the type has an offset).
template <Type T>
struct DecodeSink {
  float* out;
  TE_AVX512_INLINE void operator()(int k, __m128i q, float d, float m) const {
    __m512 v = _mm512_mul_ps(_mm512_set1_ps(d), to_float(q));
    if constexpr (kMin<T>) {
      v = _mm512_sub_ps(v, _mm512_set1_ps(m));
    } else if constexpr (kOffset<T>) {
      v = _mm512_add_ps(v, _mm512_set1_ps(m));
    }
    _mm512_storeu_ps(out + k, v);
  }
  TE_AVX512_INLINE void operator()(int k, __m128i lo, __m128i hi, float d, float m) const {
    (*this)(k, lo, d, m);
    (*this)(k + 16, hi, d, m);
  }
};

template <Type T>
TE_AVX512 void decode_blocks(const float* table, const unsigned char* p, int64_t blocks,
                             float* out) {
  for (int64_t b = 0; b < blocks; ++b, p += kBytes<T>, out += kElements<T>) {
    DecodeSink<T> sink{out};
    groups<T>(table, p, sink);
  }
}

// Adds one block's products with M inputs to acc (16 partial sums each) and offset: x is the
// inputs at the block's first value (input i at x + i * ldx), xsum their sums of 16 values
// (input i's at xsum + i * lds).
template <Type T, int M>
struct DotSink {
  const float* x;
  int64_t ldx;
  const float* xsum;
  int64_t lds;
  __m512* acc;
  float* offset;

  TE_AVX512_INLINE void operator()(int k, __m128i q, float d, float m) const {
    const __m512 w = _mm512_mul_ps(_mm512_set1_ps(d), to_float(q));
    for (int i = 0; i < M; ++i) {
      acc[i] = _mm512_fmadd_ps(w, _mm512_loadu_ps(x + i * ldx + k), acc[i]);
      if constexpr (kOffset<T>) offset[i] += (kMin<T> ? -m : m) * xsum[i * lds + k / 16];
    }
  }
  TE_AVX512_INLINE void operator()(int k, __m128i lo, __m128i hi, float d, float m) const {
    const __m512 a = to_float(lo), b = to_float(hi), dv = _mm512_set1_ps(d);
    for (int i = 0; i < M; ++i) {
      const float* xi = x + i * ldx + k;
      __m512 t = _mm512_mul_ps(a, _mm512_loadu_ps(xi));
      t = _mm512_fmadd_ps(b, _mm512_loadu_ps(xi + 16), t);
      acc[i] = _mm512_fmadd_ps(dv, t, acc[i]);
      if constexpr (kOffset<T>) {
        offset[i] += (kMin<T> ? -m : m) * (xsum[i * lds + k / 16] + xsum[i * lds + k / 16 + 1]);
      }
    }
  }
};

// dot_rows of M inputs (1 to 8), every row's blocks read once.
template <Type T, int M>
TE_AVX512 void dot_rows_m(const float* table, const unsigned char* const* rows, int64_t n_rows,
                          int64_t cols, const float* x, int64_t ldx, const float* xsum, int64_t lds,
                          float* y, int64_t ldy) {
  const int64_t blocks = cols / kElements<T>;
  for (int64_t r = 0; r < n_rows; ++r) {
    const unsigned char* p = rows[r];
    __m512 acc[M];
    float offset[M];
    for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_ps(), offset[i] = 0;
    for (int64_t b = 0; b < blocks; ++b, p += kBytes<T>) {
      const int64_t first = b * kElements<T>;
      const float* sums = kOffset<T> ? xsum + first / 16 : nullptr;
      const DotSink<T, M> sink{x + first, ldx, sums, lds, acc, offset};
      groups<T>(table, p, sink);
    }
    for (int i = 0; i < M; ++i) y[i * ldy + r] = _mm512_reduce_add_ps(acc[i]) + offset[i];
  }
}

// dot_rows_m<T, 1..8>, by the number of inputs less one.
template <Type T, std::size_t... M>
constexpr auto dot_kernels(std::index_sequence<M...>) {
  return std::array{&dot_rows_m<T, static_cast<int>(M) + 1>...};
}
template <Type T>
constexpr auto kDots = dot_kernels<T>(std::make_index_sequence<8>{});

// y[i * ldy + r] = x_i . W_r for m inputs, 8 at a time (te::ggml::dot_rows).
template <Type T>
void dot_rows(const float* table, const unsigned char* const* rows, int64_t n_rows, int64_t cols,
              const float* x, int64_t m, int64_t ldx, float* y, int64_t ldy) {
  const int64_t lds = cols / 16;
  std::vector<float> xsum;
  if (kOffset<T>) {  // each input's sum of each 16 values, for the groups' offsets
    xsum.resize(static_cast<std::size_t>(m * lds));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t g = 0; g < lds; ++g) {
        float s = 0;
        for (int j = 0; j < 16; ++j) s += x[i * ldx + g * 16 + j];
        xsum[i * lds + g] = s;
      }
    }
  }
  for (int64_t i0 = 0; i0 < m; i0 += 8) {
    const int64_t n = std::min<int64_t>(8, m - i0);
    const float* sums = kOffset<T> ? xsum.data() + i0 * lds : nullptr;
    kDots<T>[n - 1](table, rows, n_rows, cols, x + i0 * ldx, ldx, sums, lds, y + i0 * ldy, ldy);
  }
}

#undef TE_AVX512
#undef TE_AVX512_INLINE

}  // namespace te::ggml::avx512
