#pragma once

// Where te::hf's loaders read a checkpoint's tensors from, by their Hugging Face names: a
// directory of safetensors files, or a GGUF file (its llama.cpp names translated, Llama's Q/K
// rows unpermuted, blocks dequantized). Both read any box with only the bytes it needs.

#include <ATen/core/Tensor.h>

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "te/distributed/mesh.h"
#include "te/hf/config.h"
#include "te/hf/weights.h"
#include "te/nn/block_weights.h"
#include "te/nn/init.h"

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
  /// `name` (a 2-D [out, in] tensor, Hugging Face's row order) as the quantized blocks it is
  /// stored in, without reading it; nullptr when it is not stored so (every safetensors tensor,
  /// a GGUF F32, F16 or BF16 one).
  virtual std::shared_ptr<const nn::BlockMatrix> blocks(const std::string& /*name*/) {
    return nullptr;
  }
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

/// A Hugging Face directory's safetensors: model.safetensors, or the files
/// model.safetensors.index.json names.
std::unique_ptr<TensorSource> open_safetensors_dir(const std::string& dir);

/// What check_checkpoint holds a checkpoint to.
struct CheckpointCheck {
  const WeightMap& map;
  std::string loader;  ///< "load_causal_lm", for messages
  std::string where;   ///< the checkpoint's path
  std::string family;  ///< "llama", "bert", ...
  bool gguf = false;
  bool strict = true;
  /// Tensors that are not weights (buffers saved with them); never counted as extra.
  std::function<bool(const std::string&)> derived;
};
/// Every checkpoint tensor the model needs is there, with the shape its config implies and a
/// floating dtype; and (strict) the checkpoint holds nothing else. te::Error naming the file and
/// tensor otherwise. Nothing is allocated: the shapes come from `shapes`, the model built on meta
/// tensors (nn::MetaParameterScope).
void check_checkpoint(const CheckpointCheck& check, torch::nn::Module& shapes,
                      TensorSource& source);
/// Holds every GEMM kernel and embedding table of `model` whose checkpoint tensors `source`
/// keeps in quantized blocks (TensorSource::blocks; a stack may mix types) in those blocks
/// (ShardedModule::hold_blocks), releasing its parameter. Returns the blocks' bytes.
int64_t hold_blocks(torch::nn::Module& model, const WeightMap& map, TensorSource& source);
/// Fills this rank's box of every parameter of `model` from `source`: only the bytes of that
/// box are read. Returns the bytes read.
int64_t fill(torch::nn::Module& model, const WeightMap& map, TensorSource& source);

/// Every loader's way from a config and a checkpoint to a model: the checkpoint checked against
/// Model(config) built on meta tensors, then the model built under the mesh and rules in scope
/// without initial values (every parameter is overwritten), its GGUF weights held in their blocks
/// (options.dequantize_gguf, one process), filled from `source` (adding the bytes read to
/// options.bytes_read) and returned in eval mode, as from_pretrained returns it.
template <typename Model, typename Config>
Model load_into(const Config& config, const CheckpointCheck& check, TensorSource& source,
                const LoadOptions& options) {
  {
    nn::MetaParameterScope meta;
    Model shapes(config);
    check_checkpoint(check, *shapes, source);
  }
  Model model = [&] {
    nn::EmptyParameterScope empty;
    return Model(config);
  }();
  int64_t bytes_read = 0;
  if (check.gguf && !options.dequantize_gguf && current_mesh() == nullptr) {
    bytes_read += hold_blocks(*model, check.map, source);
  }
  bytes_read += fill(*model, check.map, source);
  if (options.bytes_read != nullptr) *options.bytes_read += bytes_read;
  model->eval();  // no dropout until train() is called
  return model;
}

}  // namespace te::hf::detail
