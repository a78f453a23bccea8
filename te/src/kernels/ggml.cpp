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

constexpr int64_t kQK = 256;  // the K-quants' super-block

float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      uint32_t m = man;
      do {
        ++e;
        m <<= 1;
      } while ((m & 0x400) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (m & 0x3FF) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7F800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Every half's float, computed once (256 KiB): a block's scales are a load each.
const float* half_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = half_bits_to_float(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

inline float f16_at(const float* table, const unsigned char* p) {
  return table[static_cast<uint16_t>(p[0] | p[1] << 8)];
}

// One block of type T at p into out (its elements).
template <Type T>
inline void decode_block(const float* table, const unsigned char* p, float* out) {
  switch (T) {
    case Type::kF32:
      std::memcpy(out, p, 4);
      return;
    case Type::kF16:
      out[0] = f16_at(table, p);
      return;
    case Type::kBF16: {
      const uint32_t bits = static_cast<uint32_t>(p[0] | p[1] << 8) << 16;
      std::memcpy(out, &bits, 4);
      return;
    }
    case Type::kQ8_0: {
      const float d = f16_at(table, p);
      for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(static_cast<int8_t>(p[2 + j])) * d;
      return;
    }
    case Type::kQ4_0: {
      // Low nibbles are values 0-15, high nibbles 16-31 (two loops: each vectorises whole).
      const float d = f16_at(table, p);
      for (int j = 0; j < 16; ++j) out[j] = d * static_cast<float>((p[2 + j] & 0x0F) - 8);
      for (int j = 0; j < 16; ++j) out[j + 16] = d * static_cast<float>((p[2 + j] >> 4) - 8);
      return;
    }
    case Type::kQ4_1: {
      const float d = f16_at(table, p), m = f16_at(table, p + 2);
      for (int j = 0; j < 16; ++j) out[j] = d * static_cast<float>(p[4 + j] & 0x0F) + m;
      for (int j = 0; j < 16; ++j) out[j + 16] = d * static_cast<float>(p[4 + j] >> 4) + m;
      return;
    }
    case Type::kQ4_K: {
      // d, dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32, 128 bytes of nibbles.
      const float d = f16_at(table, p), dmin = f16_at(table, p + 2);
      const unsigned char* s = p + 4;
      const unsigned char* qs = p + 16;
      for (int sb = 0; sb < 8; ++sb) {
        const int j = sb % 4;
        const int sc = sb < 4 ? (s[j] & 0x3F) : ((s[8 + j] & 0x0F) | ((s[j] >> 2) & 0x30));
        const int mn = sb < 4 ? (s[4 + j] & 0x3F) : ((s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30));
        const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(mn);
        const unsigned char* q = qs + (sb / 2) * 32;
        const int shift = (sb % 2) * 4;
        for (int l = 0; l < 32; ++l) {
          out[sb * 32 + l] = dl * static_cast<float>((q[l] >> shift) & 0x0F) - ml;
        }
      }
      return;
    }
    case Type::kQ6_K: {
      // 128 bytes of low nibbles, 64 of high 2-bit pairs, 16 int8 scales, d. Element
      // g * 128 + part * 32 + l takes the low nibble of ql[g * 64 + (part % 2) * 32 + l] (the
      // high one for parts 2 and 3), bits 2 * part of qh[g * 32 + l], scale (g * 128 + part *
      // 32 + l) / 16.
      const unsigned char* ql = p;
      const unsigned char* qh = p + 128;
      const auto* sc = reinterpret_cast<const int8_t*>(p + 192);
      const float d = f16_at(table, p + 208);
      for (int g = 0; g < 2; ++g) {
        for (int part = 0; part < 4; ++part) {
          const unsigned char* lo = ql + g * 64 + (part % 2) * 32;
          const unsigned char* hi = qh + g * 32;
          const int lo_shift = 4 * (part / 2), hi_shift = 2 * part;
          float* o = out + g * 128 + part * 32;
          for (int half = 0; half < 2; ++half) {
            const float scale = d * static_cast<float>(sc[g * 8 + part * 2 + half]);
            for (int l = half * 16; l < half * 16 + 16; ++l) {
              const int q = ((lo[l] >> lo_shift) & 0x0F) | ((hi[l] >> hi_shift) & 0x03) << 4;
              o[l] = scale * static_cast<float>(q - 32);
            }
          }
        }
      }
      return;
    }
  }
}

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
    case Type::kQ4_K:
      return decode_blocks<Type::kQ4_K>(table, p, n, b.elements, b.bytes, out);
    case Type::kQ6_K:
      return decode_blocks<Type::kQ6_K>(table, p, n, b.elements, b.bytes, out);
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
    case Type::kQ4_K:
      return {kQK, 144};
    case Type::kQ6_K:
      return {kQK, 210};
  }
  TE_FAIL("gguf: ", where, " has ggml type ", type,
          ", which te-cpp does not read (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K)");
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
    case Type::kQ4_K:
      return "Q4_K";
    case Type::kQ6_K:
      return "Q6_K";
  }
  return "type " + std::to_string(type);
}

bool is_quantized(uint32_t type) {
  switch (static_cast<Type>(type)) {
    case Type::kQ8_0:
    case Type::kQ4_0:
    case Type::kQ4_1:
    case Type::kQ4_K:
    case Type::kQ6_K:
      return true;
    default:
      return false;
  }
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
