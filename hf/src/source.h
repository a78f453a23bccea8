#pragma once

// Where load_causal_lm reads a checkpoint's tensors from, by their Hugging Face names: a
// directory of safetensors files, or a GGUF file (its llama.cpp names translated, Llama's Q/K
// rows unpermuted, blocks dequantized). Both read any box with only the bytes it needs.

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "te/hf/config.h"

namespace te::hf::detail {

class TensorSource {
 public:
  virtual ~TensorSource() = default;
  /// Every tensor, by its Hugging Face name.
  virtual std::vector<std::string> names() const = 0;
  virtual bool contains(const std::string& name) const = 0;
  virtual std::vector<int64_t> shape(const std::string& name) = 0;
  /// The dtype read() returns (te::Error naming the tensor for one LibTorch cannot hold).
  virtual at::ScalarType dtype(const std::string& name) = 0;
  /// The elements [lo, hi) of `name` (Hugging Face layout), in any float dtype.
  virtual at::Tensor read(const std::string& name, const std::vector<int64_t>& lo,
                          const std::vector<int64_t>& hi, int64_t* bytes_read) = 0;
  /// "'model.norm.weight' in '/x/model.safetensors'", for messages.
  virtual std::string where(const std::string& name) const = 0;
};

/// True when `path` is a file that starts with GGUF's magic.
bool is_gguf(const std::string& path);
/// A GGUF file's config (from its metadata and tensors) and its tensors, from one read of its
/// header.
struct GgufModel {
  CausalLMConfig config;
  std::unique_ptr<TensorSource> source;
};
GgufModel open_gguf_causal_lm(const std::string& path);

}  // namespace te::hf::detail
