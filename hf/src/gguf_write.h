#pragma once

// Writing a GGUF file (version 3, llama.cpp's format): the metadata key/values as a header holds
// them (GgufValue keeps each value's GGUF type, so a file's metadata is written back as read) and
// float32 tensors encoded as F32, F16, BF16 or Q8_0 (ggml's reference quantizer, which gguf-py's
// quants.py reproduces bit for bit). save.cpp's save_gguf writes a trained model with it.

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "te/hf/gguf.h"

namespace te::hf::detail {

/// One tensor to write: its llama.cpp name, its values (row-major, any float dtype) and the
/// ggml type to store them as (kF32, kF16, kBF16 or kQ8_0; Q8_0's last dim a multiple of 32).
struct GgufOutTensor {
  std::string name;
  at::Tensor values;
  GgmlType type = GgmlType::kF32;
};

/// Writes `path` (a temporary file renamed into place): `metadata` in key order, then the
/// tensors in order, each aligned to general.alignment (32 when absent). te::Error naming the
/// file when it cannot be written, the tensor for a type it does not encode or a Q8_0 row that
/// is not whole blocks, and the key for a value of an unknown type.
void write_gguf(const std::string& path, const std::map<std::string, GgufValue>& metadata,
                const std::vector<GgufOutTensor>& tensors);

}  // namespace te::hf::detail
