// ggml's block formats: decoding and the row kernels (te/kernels/ggml.h). Each block type's decode
// is written once, as loops over whole blocks that the compiler vectorises; on x86-64 (GCC) the
// three entry points are built for AVX-512 and AVX2 + FMA as well as the baseline, the loader
// picking one per process (function multi-versioning), so one binary runs anywhere.

#include "te/kernels/ggml.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#include "ggml_blocks.h"
#include "te/error.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TE_GGML_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TE_GGML_CLONES
#endif
// The 32-value types' kernels in AVX-512 intrinsics, chosen at run time where the CPU has it.
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define TE_GGML_AVX512 1
#else
#define TE_GGML_AVX512 0
#endif

namespace te::ggml {

namespace {

// The block layouts (ggml_blocks.h).
using blocks::decode_block;
using blocks::f16_at;
using blocks::half_table;
using blocks::kQK;

#if TE_GGML_AVX512
// The 32-value types (Q8_0, Q4_0, Q4_1) with AVX-512: a block's values as two vectors of 16
// floats, and its scale and offset (value = d * q + m; Q4_0's q - 8 as m = -8 d is not used for
// decoding, which computes d * (q - 8) as gguf-py does).
template <Type T>
__attribute__((target("avx512f"))) inline void block_values(const unsigned char* p, __m512* lo,
                                                             __m512* hi) {
  if constexpr (T == Type::kQ8_0) {
    *lo = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2))));
    *hi = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 18))));
  } else {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + (T == Type::kQ4_1 ? 4 : 2)));
    const __m128i mask = _mm_set1_epi8(0x0F);
    __m512i l = _mm512_cvtepu8_epi32(_mm_and_si128(v, mask));
    __m512i h = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), mask));
    if constexpr (T == Type::kQ4_0) {
      l = _mm512_sub_epi32(l, _mm512_set1_epi32(8));
      h = _mm512_sub_epi32(h, _mm512_set1_epi32(8));
    }
    *lo = _mm512_cvtepi32_ps(l);
    *hi = _mm512_cvtepi32_ps(h);
  }
}

// decode_blocks for the 32-value types: the same values, bit for bit (a multiply, then an add).
template <Type T>
__attribute__((target("avx512f"))) void decode_blocks_avx512(const float* table,
                                                             const unsigned char* p,
                                                             int64_t blocks, float* out) {
  constexpr int64_t kBytes = T == Type::kQ8_0 ? 34 : T == Type::kQ4_0 ? 18 : 20;
  for (int64_t b = 0; b < blocks; ++b, p += kBytes, out += 32) {
    __m512 lo, hi;
    block_values<T>(p, &lo, &hi);
    const __m512 d = _mm512_set1_ps(f16_at(table, p));
    lo = _mm512_mul_ps(lo, d);
    hi = _mm512_mul_ps(hi, d);
    if constexpr (T == Type::kQ4_1) {
      const __m512 m = _mm512_set1_ps(f16_at(table, p + 2));
      lo = _mm512_add_ps(lo, m);
      hi = _mm512_add_ps(hi, m);
    }
    _mm512_storeu_ps(out, lo);
    _mm512_storeu_ps(out + 16, hi);
  }
}

// dot_rows for the 32-value types, up to 8 inputs at a time: per block, d * sum(q x) (+ m *
// sum(x), the inputs' block sums taken once per call) without decoding the row first.
template <Type T, int M>
__attribute__((target("avx512f"))) void dot_rows_avx512(const float* table,
                                                        const unsigned char* const* rows,
                                                        int64_t n_rows, int64_t cols,
                                                        const float* x, int64_t ldx,
                                                        const float* xsum, float* y,
                                                        int64_t ldy) {
  const int64_t blocks = cols / 32;
  constexpr int64_t kBytes = T == Type::kQ8_0 ? 34 : T == Type::kQ4_0 ? 18 : 20;
  for (int64_t r = 0; r < n_rows; ++r) {
    const unsigned char* p = rows[r];
    __m512 acc[M];
    float offset[M];
    for (int i = 0; i < M; ++i) acc[i] = _mm512_setzero_ps(), offset[i] = 0;
    for (int64_t b = 0; b < blocks; ++b, p += kBytes) {
      __m512 lo, hi;
      block_values<T>(p, &lo, &hi);
      const __m512 d = _mm512_set1_ps(f16_at(table, p));
      const float m = T == Type::kQ4_1 ? f16_at(table, p + 2) : 0.0f;
      for (int i = 0; i < M; ++i) {
        const float* xb = x + i * ldx + b * 32;
        __m512 t = _mm512_mul_ps(lo, _mm512_loadu_ps(xb));
        t = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xb + 16), t);
        acc[i] = _mm512_fmadd_ps(d, t, acc[i]);
        if constexpr (T == Type::kQ4_1) offset[i] += m * xsum[i * blocks + b];
      }
    }
    for (int i = 0; i < M; ++i) y[i * ldy + r] = _mm512_reduce_add_ps(acc[i]) + offset[i];
  }
}

// dot_rows_avx512<T, 1..8>, by the number of inputs less one.
template <Type T, std::size_t... M>
constexpr auto dot_kernels(std::index_sequence<M...>) {
  return std::array{&dot_rows_avx512<T, static_cast<int>(M) + 1>...};
}
template <Type T>
constexpr auto kDots = dot_kernels<T>(std::make_index_sequence<8>{});

template <Type T>
void dot_rows_fast(const float* table, const unsigned char* const* rows, int64_t n_rows,
                   int64_t cols, const float* x, int64_t m, int64_t ldx, float* y, int64_t ldy) {
  const int64_t blocks = cols / 32;
  std::vector<float> xsum;
  if (T == Type::kQ4_1) {
    xsum.resize(static_cast<std::size_t>(m * blocks));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t b = 0; b < blocks; ++b) {
        float s = 0;
        for (int j = 0; j < 32; ++j) s += x[i * ldx + b * 32 + j];
        xsum[i * blocks + b] = s;
      }
    }
  }
  for (int64_t i0 = 0; i0 < m; i0 += 8) {
    const int64_t n = std::min<int64_t>(8, m - i0);
    const float* xi = x + i0 * ldx;
    const float* si = T == Type::kQ4_1 ? xsum.data() + i0 * blocks : nullptr;
    float* yi = y + i0 * ldy;
    kDots<T>[n - 1](table, rows, n_rows, cols, xi, ldx, si, yi, ldy);
  }
}

bool have_avx512() {
  static const bool have = __builtin_cpu_supports("avx512f");
  return have;
}
#endif

template <Type T>
inline void decode_blocks(const float* table, const unsigned char* p, int64_t blocks,
                          int64_t per_block, int64_t block_bytes, float* out) {
  for (int64_t i = 0; i < blocks; ++i, p += block_bytes, out += per_block) {
    decode_block<T>(table, p, out);
  }
}

// `count` values (whole blocks) of `type` at p into out; the type chosen once per call. `fast`:
// the AVX-512 kernels where the CPU has them.
inline void decode(uint32_t type, const float* table, const unsigned char* p, int64_t count,
                   float* out, bool fast = true) {
  const BlockShape b = block_shape(type, "a tensor");
  const int64_t n = count / b.elements;
#if TE_GGML_AVX512
  if (fast && have_avx512()) {
    switch (static_cast<Type>(type)) {
      case Type::kQ8_0:
        return decode_blocks_avx512<Type::kQ8_0>(table, p, n, out);
      case Type::kQ4_0:
        return decode_blocks_avx512<Type::kQ4_0>(table, p, n, out);
      case Type::kQ4_1:
        return decode_blocks_avx512<Type::kQ4_1>(table, p, n, out);
      default:
        break;
    }
  }
#endif
  switch (static_cast<Type>(type)) {
    case Type::kF32:
      return decode_blocks<Type::kF32>(table, p, n, b.elements, b.bytes, out);
    case Type::kF16:
      return decode_blocks<Type::kF16>(table, p, n, b.elements, b.bytes, out);
    case Type::kBF16:
      return decode_blocks<Type::kBF16>(table, p, n, b.elements, b.bytes, out);
    case Type::kQ8_0:
      return decode_blocks<Type::kQ8_0>(table, p, n, b.elements, b.bytes, out);
    case Type::kQ4_0:
      return decode_blocks<Type::kQ4_0>(table, p, n, b.elements, b.bytes, out);
    case Type::kQ4_1:
      return decode_blocks<Type::kQ4_1>(table, p, n, b.elements, b.bytes, out);
    case Type::kQ5_0:
      return decode_blocks<Type::kQ5_0>(table, p, n, b.elements, b.bytes, out);
    case Type::kQ5_1:
      return decode_blocks<Type::kQ5_1>(table, p, n, b.elements, b.bytes, out);
    case Type::kQ2_K:
      return decode_blocks<Type::kQ2_K>(table, p, n, b.elements, b.bytes, out);
    case Type::kQ3_K:
      return decode_blocks<Type::kQ3_K>(table, p, n, b.elements, b.bytes, out);
    case Type::kQ4_K:
      return decode_blocks<Type::kQ4_K>(table, p, n, b.elements, b.bytes, out);
    case Type::kQ5_K:
      return decode_blocks<Type::kQ5_K>(table, p, n, b.elements, b.bytes, out);
    case Type::kQ6_K:
      return decode_blocks<Type::kQ6_K>(table, p, n, b.elements, b.bytes, out);
    case Type::kIQ4_NL:
      return decode_blocks<Type::kIQ4_NL>(table, p, n, b.elements, b.bytes, out);
    case Type::kIQ4_XS:
      return decode_blocks<Type::kIQ4_XS>(table, p, n, b.elements, b.bytes, out);
  }
}

// sum_k a[k] * b[k] over 16 independent partial sums (n a multiple of 16 here: whole blocks of
// 32 or 256), so the loop vectorises without reassociating a single sum.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    for (int l = 0; l < 16; ++l) acc[l] += a[k + l] * b[k + l];
  }
  float tail = 0;
  for (; k < n; ++k) tail += a[k] * b[k];
  for (int w = 8; w >= 1; w /= 2) {
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  }
  return acc[0] + tail;
}


}  // namespace

BlockShape block_shape(uint32_t type, const std::string& where) {
  switch (static_cast<Type>(type)) {
    case Type::kF32:
      return {1, 4};
    case Type::kF16:
      return {1, 2};
    case Type::kBF16:
      return {1, 2};
    case Type::kQ8_0:
      return {32, 34};
    case Type::kQ4_0:
      return {32, 18};
    case Type::kQ4_1:
      return {32, 20};
    case Type::kQ5_0:
      return {32, 22};
    case Type::kQ5_1:
      return {32, 24};
    case Type::kQ2_K:
      return {kQK, 84};
    case Type::kQ3_K:
      return {kQK, 110};
    case Type::kQ4_K:
      return {kQK, 144};
    case Type::kQ5_K:
      return {kQK, 176};
    case Type::kQ6_K:
      return {kQK, 210};
    case Type::kIQ4_NL:
      return {32, 18};
    case Type::kIQ4_XS:
      return {kQK, 136};
  }
  TE_FAIL("gguf: ", where, " has ggml type ", type,
          ", which te-cpp does not read (it reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
          "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS)");
}

std::string type_name(uint32_t type) {
  switch (static_cast<Type>(type)) {
    case Type::kF32:
      return "F32";
    case Type::kF16:
      return "F16";
    case Type::kBF16:
      return "BF16";
    case Type::kQ8_0:
      return "Q8_0";
    case Type::kQ4_0:
      return "Q4_0";
    case Type::kQ4_1:
      return "Q4_1";
    case Type::kQ5_0:
      return "Q5_0";
    case Type::kQ5_1:
      return "Q5_1";
    case Type::kQ2_K:
      return "Q2_K";
    case Type::kQ3_K:
      return "Q3_K";
    case Type::kQ4_K:
      return "Q4_K";
    case Type::kQ5_K:
      return "Q5_K";
    case Type::kQ6_K:
      return "Q6_K";
    case Type::kIQ4_NL:
      return "IQ4_NL";
    case Type::kIQ4_XS:
      return "IQ4_XS";
  }
  return "type " + std::to_string(type);
}

bool is_quantized(uint32_t type) {
  switch (static_cast<Type>(type)) {
    case Type::kF32:
    case Type::kF16:
    case Type::kBF16:
      return false;
    case Type::kQ4_0:
    case Type::kQ4_1:
    case Type::kQ5_0:
    case Type::kQ5_1:
    case Type::kQ8_0:
    case Type::kQ2_K:
    case Type::kQ3_K:
    case Type::kQ4_K:
    case Type::kQ5_K:
    case Type::kQ6_K:
    case Type::kIQ4_NL:
    case Type::kIQ4_XS:
      return true;
  }
  return false;
}

TE_GGML_CLONES
void dequantize(uint32_t type, const unsigned char* data, int64_t count, float* out) {
  decode(type, half_table(), data, count, out);
}

TE_GGML_CLONES
void dequantize_portable(uint32_t type, const unsigned char* data, int64_t count, float* out) {
  decode(type, half_table(), data, count, out, /*fast=*/false);
}

TE_GGML_CLONES
void dequantize_rows(uint32_t type, const unsigned char* const* rows, int64_t n_rows, int64_t cols,
                     float* out, int64_t ld) {
  const float* table = half_table();
  for (int64_t r = 0; r < n_rows; ++r) decode(type, table, rows[r], cols, out + r * ld);
}

TE_GGML_CLONES
void dot_rows(uint32_t type, const unsigned char* const* rows, int64_t n_rows, int64_t cols,
              const float* x, int64_t m, int64_t ldx, float* y, int64_t ldy) {
  const float* table = half_table();
#if TE_GGML_AVX512
  if (have_avx512()) {
    switch (static_cast<Type>(type)) {
      case Type::kQ8_0:
        return dot_rows_fast<Type::kQ8_0>(table, rows, n_rows, cols, x, m, ldx, y, ldy);
      case Type::kQ4_0:
        return dot_rows_fast<Type::kQ4_0>(table, rows, n_rows, cols, x, m, ldx, y, ldy);
      case Type::kQ4_1:
        return dot_rows_fast<Type::kQ4_1>(table, rows, n_rows, cols, x, m, ldx, y, ldy);
      default:
        break;
    }
  }
#endif
  std::vector<float> row(static_cast<std::size_t>(cols));
  for (int64_t r = 0; r < n_rows; ++r) {
    decode(type, table, rows[r], cols, row.data());
    for (int64_t i = 0; i < m; ++i) y[i * ldy + r] = dot(x + i * ldx, row.data(), cols);
  }
}

}  // namespace te::ggml
