#pragma once

// ggml's block layouts, one decoder per family (internal to te::ggml: ggml.cpp includes it
// alone, so every decode inlines into the kernels built there with -ffp-contract=off, a value
// being a multiply then an add as gguf-py's quants.py computes it).
// Layouts: gguf-py 0.19.0 quants.py (each type's dequantize_blocks) and ggml-common.h.

#include <cstdint>
#include <cstring>
#include <vector>

#include "te/kernels/ggml.h"

// The decodes inline into every caller, so each function clone of ggml.cpp (AVX-512, AVX2,
// baseline) vectorises them for its own instruction set.
#if defined(__GNUC__)
#define TE_GGML_INLINE inline __attribute__((always_inline))
#else
#define TE_GGML_INLINE inline
#endif

namespace te::ggml::blocks {

constexpr int64_t kQK = 256;  // the K-quants' super-block

// IQ4_NL's and IQ4_XS's 16 levels (ggml-common.h kvalues_iq4nl; gguf-py IQ4_NL.kvalues).
constexpr int8_t kIq4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                   1,    13,   25,  38,  53,  69,  89,  113};

// MXFP4's 16 levels: E2M1's values doubled (ggml-common.h kvalues_mxfp4; gguf-py MXFP4.kvalues),
// the block's scale halved to match (e8m0_half).
constexpr int8_t kMxfp4Values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// An E8M0 scale 2^(e - 127), halved: ggml-impl.h ggml_e8m0_to_fp32_half (gguf-py
// MXFP4.e8m0_to_fp32_half), e < 2 the subnormals 2^-128 and 2^-127.
inline float e8m0_half(unsigned char e) {
  const uint32_t bits = e < 2 ? 0x00200000u << e : static_cast<uint32_t>(e - 1) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline float half_bits_to_float(uint16_t h) {
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
inline const float* half_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = half_bits_to_float(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

TE_GGML_INLINE float f16_at(const float* table, const unsigned char* p) {
  return table[static_cast<uint16_t>(p[0] | p[1] << 8)];
}

// F32, F16 and BF16: one value per block.
template <Type T>
TE_GGML_INLINE void decode_float(const float* table, const unsigned char* p, float* out) {
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
    default:
      return;
  }
}

// The 32-value types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4.
template <Type T>
TE_GGML_INLINE void decode_32(const float* table, const unsigned char* p, float* out) {
  switch (T) {
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
    case Type::kQ5_0:
    case Type::kQ5_1: {
      // d (and m), 32 high bits (bit j: value j's fifth bit), 16 bytes of low nibbles as Q4_0's.
      const float d = f16_at(table, p);
      const float m = T == Type::kQ5_1 ? f16_at(table, p + 2) : 0.0f;
      const unsigned char* h = p + (T == Type::kQ5_1 ? 4 : 2);
      const unsigned char* qs = h + 4;
      const uint32_t qh =
          static_cast<uint32_t>(h[0] | h[1] << 8 | h[2] << 16) | static_cast<uint32_t>(h[3]) << 24;
      // Two loops (low nibbles, then high ones), each of which vectorises whole.
      int q[32];
      for (int j = 0; j < 16; ++j) q[j] = qs[j] & 0x0F;
      for (int j = 0; j < 16; ++j) q[j + 16] = qs[j] >> 4;
      for (int j = 0; j < 32; ++j) q[j] |= static_cast<int>((qh >> j) & 1u) << 4;
      for (int j = 0; j < 32; ++j) {
        if constexpr (T == Type::kQ5_1) {
          out[j] = d * static_cast<float>(q[j]) + m;
        } else {
          out[j] = d * static_cast<float>(q[j] - 16);
        }
      }
      return;
    }
    case Type::kIQ4_NL: {
      // d, 16 bytes of nibbles (low ones values 0-15) indexing the non-linear table.
      const float d = f16_at(table, p);
      for (int j = 0; j < 16; ++j) out[j] = d * static_cast<float>(kIq4Values[p[2 + j] & 0x0F]);
      for (int j = 0; j < 16; ++j) out[j + 16] = d * static_cast<float>(kIq4Values[p[2 + j] >> 4]);
      return;
    }
    case Type::kMXFP4: {
      // An E8M0 scale byte, 16 bytes of nibbles (low ones values 0-15) indexing MXFP4's levels.
      const float d = e8m0_half(p[0]);
      for (int j = 0; j < 16; ++j) out[j] = d * static_cast<float>(kMxfp4Values[p[1 + j] & 0x0F]);
      for (int j = 0; j < 16; ++j) {
        out[j + 16] = d * static_cast<float>(kMxfp4Values[p[1 + j] >> 4]);
      }
      return;
    }
    default:
      return;
  }
}

// Q2_K and Q3_K: 2-bit values in 16 sub-blocks of 16.
template <Type T>
TE_GGML_INLINE void decode_low_k(const float* table, const unsigned char* p, float* out) {
  switch (T) {
    case Type::kQ2_K: {
      // 16 bytes of 4-bit scale and min pairs (one per 16 values), 64 bytes of 2-bit values,
      // d, dmin. Value g * 128 + s * 32 + l is bits 2s of qs[g * 32 + l].
      const unsigned char* scales = p;
      const unsigned char* qs = p + 16;
      const float d = f16_at(table, p + 80), dmin = f16_at(table, p + 82);
      for (int g = 0; g < 2; ++g) {
        for (int s = 0; s < 4; ++s) {
          for (int half = 0; half < 2; ++half) {  // a sub-block of 16: its scale and min
            const int sb = g * 8 + s * 2 + half;
            const float dl = d * static_cast<float>(scales[sb] & 0x0F);
            const float ml = dmin * static_cast<float>(scales[sb] >> 4);
            const unsigned char* q = qs + g * 32 + half * 16;
            float* o = out + sb * 16;
            for (int l = 0; l < 16; ++l) o[l] = dl * static_cast<float>((q[l] >> (2 * s)) & 3) - ml;
          }
        }
      }
      return;
    }
    case Type::kQ3_K: {
      // 32 bytes of high bits (bit b of hmask[l]: value b * 32 + l; 0 means minus 4), 64 bytes
      // of 2-bit values as Q2_K's, 12 bytes of sixteen 6-bit scales (offset 32), d.
      const unsigned char* hmask = p;
      const unsigned char* qs = p + 32;
      const unsigned char* sc = p + 96;
      const float d = f16_at(table, p + 108);
      float dl[16];
      for (int i = 0; i < 16; ++i) {
        const int low = (sc[i % 8] >> (4 * (i / 8))) & 0x0F;
        const int high = (sc[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        dl[i] = d * static_cast<float>((low | high << 4) - 32);
      }
      for (int g = 0; g < 2; ++g) {
        for (int s = 0; s < 4; ++s) {
          const int bit = g * 4 + s;  // value e's high bit is bit e / 32 of hmask[e % 32]
          for (int half = 0; half < 2; ++half) {
            const int sb = g * 8 + s * 2 + half;
            const unsigned char* q = qs + g * 32 + half * 16;
            const unsigned char* h = hmask + half * 16;
            float* o = out + sb * 16;
            for (int l = 0; l < 16; ++l) {
              const int value = ((q[l] >> (2 * s)) & 3) - (((h[l] >> bit) & 1) ? 0 : 4);
              o[l] = dl[sb] * static_cast<float>(value);
            }
          }
        }
      }
      return;
    }
    default:
      return;
  }
}

// Q4_K and Q5_K: 4- and 5-bit values in 8 sub-blocks of 32, 6-bit scales and mins.
template <Type T>
TE_GGML_INLINE void decode_mid_k(const float* table, const unsigned char* p, float* out) {
  switch (T) {
    case Type::kQ4_K:
    case Type::kQ5_K: {
      // d, dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32, (Q5_K: 32 bytes of
      // fifth bits, bit sb of qh[l] for value sb * 32 + l,) 128 bytes of nibbles.
      const float d = f16_at(table, p), dmin = f16_at(table, p + 2);
      const unsigned char* s = p + 4;
      const unsigned char* qh = p + 16;
      const unsigned char* qs = p + (T == Type::kQ5_K ? 48 : 16);
      for (int sb = 0; sb < 8; ++sb) {
        const int j = sb % 4;
        const int sc = sb < 4 ? (s[j] & 0x3F) : ((s[8 + j] & 0x0F) | ((s[j] >> 2) & 0x30));
        const int mn = sb < 4 ? (s[4 + j] & 0x3F) : ((s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30));
        const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(mn);
        const unsigned char* q = qs + (sb / 2) * 32;
        const int shift = (sb % 2) * 4;
        for (int l = 0; l < 32; ++l) {
          int v = (q[l] >> shift) & 0x0F;
          if (T == Type::kQ5_K) v |= ((qh[l] >> sb) & 1) << 4;
          out[sb * 32 + l] = dl * static_cast<float>(v) - ml;
        }
      }
      return;
    }
    default:
      return;
  }
}

// Q6_K and IQ4_XS.
template <Type T>
TE_GGML_INLINE void decode_high_k(const float* table, const unsigned char* p, float* out) {
  switch (T) {
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
    case Type::kIQ4_XS: {
      // d, 16 high and 4 bytes of low scale bits (eight 6-bit scales, offset 32), then per
      // sub-block of 32 values 16 bytes of nibbles indexing IQ4_NL's table.
      const float d = f16_at(table, p);
      const int scales_h = p[2] | p[3] << 8;
      const unsigned char* scales_l = p + 4;
      const unsigned char* qs = p + 8;
      for (int ib = 0; ib < 8; ++ib) {
        const int low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
        const int high = (scales_h >> (2 * ib)) & 0x03;
        const float dl = d * static_cast<float>((low | high << 4) - 32);
        const unsigned char* q = qs + ib * 16;
        float* o = out + ib * 32;
        for (int l = 0; l < 16; ++l) o[l] = dl * static_cast<float>(kIq4Values[q[l] & 0x0F]);
        for (int l = 0; l < 16; ++l) o[l + 16] = dl * static_cast<float>(kIq4Values[q[l] >> 4]);
      }
      return;
    }
    default:
      return;
  }
}

// One block of type T at p into out (its elements).
template <Type T>
TE_GGML_INLINE void decode_block(const float* table, const unsigned char* p, float* out) {
  if constexpr (T == Type::kF32 || T == Type::kF16 || T == Type::kBF16) {
    decode_float<T>(table, p, out);
  } else if constexpr (T == Type::kQ2_K || T == Type::kQ3_K) {
    decode_low_k<T>(table, p, out);
  } else if constexpr (T == Type::kQ4_K || T == Type::kQ5_K) {
    decode_mid_k<T>(table, p, out);
  } else if constexpr (T == Type::kQ6_K || T == Type::kIQ4_XS) {
    decode_high_k<T>(table, p, out);
  } else {
    decode_32<T>(table, p, out);
  }
}

}  // namespace te::ggml::blocks
