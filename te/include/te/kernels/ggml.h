#pragma once

// ggml's tensor formats (the kernels layer: no LibTorch): the block sizes, dequantization, and the
// row kernels that multiply weights left in their blocks (te::nn::BlockMatrix, GGUF weights held
// as llama.cpp holds them). Layouts: ggml's GGUF spec (docs/gguf.md of ggml) and gguf-py 0.19.0's
// constants.py / quants.py (GGML_QUANT_SIZES, Q4_0.dequantize_blocks, ...), which
// tests/interop/check_gguf.py runs against this code.

#include <cstdint>
#include <string>

namespace te::ggml {

/// ggml's tensor types that te-cpp reads (their ggml numbers): every type of llama.cpp's
/// standard quantization mixes (Q2_K to Q8_0, IQ4_NL, IQ4_XS), MXFP4 (OCP's microscaling FP4, in
/// which llama.cpp's converter keeps gpt-oss's experts) and the float ones.
enum class Type : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kBF16 = 30,
  kMXFP4 = 39,
};

/// A type's block: `elements` values stored in `bytes` bytes (1 and 4 for F32).
struct BlockShape {
  int64_t elements = 0, bytes = 0;
};

/// The block of ggml type `type`; te::Error naming `where` for a type te-cpp does not read.
BlockShape block_shape(uint32_t type, const std::string& where);

/// "Q4_1", or "type N" for one te-cpp does not read.
std::string type_name(uint32_t type);

/// Whether `type` is one of the quantized block types (every Type but F32, F16 and BF16), which
/// te::nn can keep in their blocks and decode inside its GEMMs.
bool is_quantized(uint32_t type);

/// Decodes `count` values (whole blocks of `type`) from `data` into `out`.
void dequantize(uint32_t type, const unsigned char* data, int64_t count, float* out);

/// Rows of a matrix W [n_rows, cols] kept in blocks of `type`: row r's cols values (whole blocks)
/// are the blocks at rows[r]. Decodes them into out[r * ld + k].
void dequantize_rows(uint32_t type, const unsigned char* const* rows, int64_t n_rows, int64_t cols,
                     float* out, int64_t ld);

/// y[i * ldy + r] = sum_k x[i * ldx + k] * W[r, k] for i < m and r < n_rows, W as for
/// dequantize_rows, in float32. On AVX-512 (F, BW, VL), every quantized type: per group of 16
/// (or 32) values sharing a scale, d * sum(q x) (+ m * sum(x)), 8 inputs at a time, no row
/// written out; elsewhere each row decoded once into a buffer of one row, then multiplied with
/// the m inputs (16 partial sums per dot).
void dot_rows(uint32_t type, const unsigned char* const* rows, int64_t n_rows, int64_t cols,
              const float* x, int64_t m, int64_t ldx, float* y, int64_t ldy);

/// dequantize by the portable loops alone (what a CPU without AVX-512 runs), never the AVX-512
/// kernels: the tests hold the two to the same bits.
void dequantize_portable(uint32_t type, const unsigned char* data, int64_t count, float* out);

}  // namespace te::ggml
