#pragma once

// Weights held in ggml's quantized blocks (every te::ggml::Type but F32, F16 and BF16), as a GGUF
// file stores them and llama.cpp multiplies them: a model loaded from GGUF on one process keeps
// them so (te::hf::LoadOptions::dequantize_gguf), a tenth to a half of float32's bytes, mapped
// from the file rather than copied, and every GEMM and lookup decodes the rows it uses.
// Inference only: the values are the file's, so the products equal float32 GEMMs of the
// dequantized weights within float32 rounding.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace te::nn {

/// A matrix W [rows, cols] in ggml blocks of a quantized type: row r's cols values (whole
/// blocks) are the bytes at row_data[r], which `owner` keeps alive (a mapped file, or a buffer).
/// Rows may lie anywhere: a permutation or a stack of rows costs only the pointers. A stack of
/// tensors of different types (a Q4_K_M file's Q4_K attn_k beside its Q6_K attn_v) gives each
/// row its type in row_types.
struct BlockMatrix {
  uint32_t type = 0;  ///< a te::ggml::Type: every row's, unless row_types says otherwise
  int64_t rows = 0, cols = 0;
  std::vector<const unsigned char*> row_data;
  std::shared_ptr<const void> owner;
  std::vector<uint32_t> row_types;  ///< empty, or each row's type

  /// Row r's type.
  uint32_t type_of(int64_t r) const { return row_types.empty() ? type : row_types[r]; }
  /// "Q4_K", or "Q4_K and Q6_K" for rows of two types: the types, for messages.
  std::string type_names() const;
  /// The blocks' bytes (each row's bytes, summed).
  int64_t bytes() const;
  /// te::Error naming `what` unless every type is a quantized ggml type whose blocks cols fills
  /// whole, row_data is one pointer per row, and row_types empty or one type per row.
  void check(const std::string& what) const;
};

/// y = x @ W^T over x's last dim (cols): [..., cols] -> [..., rows], in x's dtype (computed in
/// float32). Up to 8 rows of x multiply W's rows straight from their blocks (te::ggml::dot_rows);
/// more decode 2 MB panels of W into float32 and multiply them with the CPU GEMM te::nn uses
/// (functional::dense). CPU only,
/// inference only: te::Error naming `what` when x requires grad under grad mode (load the float32
/// weights to train), is not on the CPU, or does not contract.
at::Tensor block_linear(const at::Tensor& x, const BlockMatrix& w, const std::string& what);

/// A mixture's experts held in one matrix, each expert's rows after the last's (w.rows / experts
/// each): x's rows grouped by expert (m_splits each, experts first, first + 1, ...) each times
/// its expert's rows (block_linear), plus bias[e] [experts, out] when defined: [x rows, out].
at::Tensor grouped_block_linear(const at::Tensor& x, const BlockMatrix& w, int64_t experts,
                                const std::vector<int64_t>& m_splits, int64_t first,
                                const at::Tensor& bias, const std::string& what);

/// The rows of W at integer CPU `ids` (any shape), decoded: [ids' shape..., cols] float32. An id
/// outside [0, rows), or ids on another device, is a te::Error naming it and `what`.
at::Tensor block_rows(const BlockMatrix& w, const at::Tensor& ids, const std::string& what);

/// W decoded whole: [rows, cols] float32.
at::Tensor dequantize(const BlockMatrix& w);

}  // namespace te::nn
