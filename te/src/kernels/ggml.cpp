// ggml's block formats: decoding and the row kernels (te/kernels/ggml.h). Each block type's decode
// is written once, as loops over whole blocks that the compiler vectorises; on x86-64 (GCC) the
// three entry points are built for AVX-512 and AVX2 + FMA as well as the baseline, the loader
// picking one per process (function multi-versioning), so one binary runs anywhere.

#include "te/kernels/ggml.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "ggml_blocks.h"
#include "te/error.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TE_GGML_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TE_GGML_CLONES
#endif
// The type dispatch inlines into each clone as the decodes do (TE_GGML_INLINE, ggml_blocks.h).
#if defined(__GNUC__)
#define TE_GGML_INLINE_LAMBDA __attribute__((always_inline))
#else
#define TE_GGML_INLINE_LAMBDA
#endif
// Every quantized type's kernels in AVX-512 intrinsics, chosen at run time where the CPU has it.
#if defined(__x86_64__) && defined(__GNUC__)
#include "ggml_avx512.h"
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

// f(std::integral_constant<Type, T>{}) for the Type `type` names (one te-cpp reads).
template <typename F>
TE_GGML_INLINE void for_type(uint32_t type, F&& f) {
  switch (static_cast<Type>(type)) {
    case Type::kF32:
      return f(std::integral_constant<Type, Type::kF32>{});
    case Type::kF16:
      return f(std::integral_constant<Type, Type::kF16>{});
    case Type::kBF16:
      return f(std::integral_constant<Type, Type::kBF16>{});
    case Type::kQ8_0:
      return f(std::integral_constant<Type, Type::kQ8_0>{});
    case Type::kQ4_0:
      return f(std::integral_constant<Type, Type::kQ4_0>{});
    case Type::kQ4_1:
      return f(std::integral_constant<Type, Type::kQ4_1>{});
    case Type::kQ5_0:
      return f(std::integral_constant<Type, Type::kQ5_0>{});
    case Type::kQ5_1:
      return f(std::integral_constant<Type, Type::kQ5_1>{});
    case Type::kQ2_K:
      return f(std::integral_constant<Type, Type::kQ2_K>{});
    case Type::kQ3_K:
      return f(std::integral_constant<Type, Type::kQ3_K>{});
    case Type::kQ4_K:
      return f(std::integral_constant<Type, Type::kQ4_K>{});
    case Type::kQ5_K:
      return f(std::integral_constant<Type, Type::kQ5_K>{});
    case Type::kQ6_K:
      return f(std::integral_constant<Type, Type::kQ6_K>{});
    case Type::kIQ4_NL:
      return f(std::integral_constant<Type, Type::kIQ4_NL>{});
    case Type::kIQ4_XS:
      return f(std::integral_constant<Type, Type::kIQ4_XS>{});
    case Type::kMXFP4:
      return f(std::integral_constant<Type, Type::kMXFP4>{});
  }
}

template <Type T>
constexpr bool kQuantized = T != Type::kF32&& T != Type::kF16&& T != Type::kBF16;

template <Type T>
TE_GGML_INLINE void decode_blocks(const float* table, const unsigned char* p, int64_t blocks,
                                  int64_t per_block, int64_t block_bytes, float* out) {
  for (int64_t i = 0; i < blocks; ++i, p += block_bytes, out += per_block) {
    decode_block<T>(table, p, out);
  }
}

// `count` values (whole blocks) of `type` at p into out; the type chosen once per call. `fast`:
// the AVX-512 kernels where the CPU has them.
TE_GGML_INLINE void decode(uint32_t type, const float* table, const unsigned char* p, int64_t count,
                           float* out, bool fast = true) {
  const BlockShape b = block_shape(type, "a tensor");
  const int64_t n = count / b.elements;
#if TE_GGML_AVX512
  if (fast && avx512::available()) {
    return for_type(type, [&](auto t) TE_GGML_INLINE_LAMBDA {
      constexpr Type kT = decltype(t)::value;
      if constexpr (kQuantized<kT>) {
        avx512::decode_blocks<kT>(table, p, n, out);
      } else {
        decode_blocks<kT>(table, p, n, b.elements, b.bytes, out);
      }
    });
  }
#endif
  for_type(type, [&](auto t) TE_GGML_INLINE_LAMBDA {
    decode_blocks<decltype(t)::value>(table, p, n, b.elements, b.bytes, out);
  });
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
    case Type::kMXFP4:
      return {32, 17};
  }
  TE_FAIL("gguf: ", where, " has ggml type ", type,
          ", which te-cpp does not read (it reads F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
          "Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4)");
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
    case Type::kMXFP4:
      return "MXFP4";
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
    case Type::kMXFP4:
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
  if (avx512::available() && is_quantized(type)) {
    return for_type(type, [&](auto t) TE_GGML_INLINE_LAMBDA {
      constexpr Type kT = decltype(t)::value;
      if constexpr (kQuantized<kT>) {
        avx512::dot_rows<kT>(table, rows, n_rows, cols, x, m, ldx, y, ldy);
      }
    });
  }
#endif
  std::vector<float> row(static_cast<std::size_t>(cols));
  for (int64_t r = 0; r < n_rows; ++r) {
    decode(type, table, rows[r], cols, row.data());
    for (int64_t i = 0; i < m; ++i) y[i * ldy + r] = dot(x + i * ldx, row.data(), cols);
  }
}

}  // namespace te::ggml
