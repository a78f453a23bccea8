#pragma once

// How te::hf maps a Hugging Face checkpoint's tensors onto a te::nn model's parameters, and the
// options its loaders (load_causal_lm, load_encoder) take.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "te/nn/attention_types.h"

namespace te::hf {

/// Options of load_causal_lm and load_encoder.
struct LoadOptions {
  /// Every tensor of the checkpoint must be used and every parameter found (false: tensors the
  /// model has no use for are skipped; missing ones are still an error).
  bool strict = true;
  /// When set, the tensor bytes this rank read are added here (a GGUF file's weights held in
  /// their blocks count as read).
  int64_t* bytes_read = nullptr;
  /// GGUF files: false (default) keeps the quantized weights (every quantized ggml type) in
  /// their blocks, mapped from the file, when the model is built on one process (no mesh in
  /// scope), as llama.cpp holds them: each GEMM and lookup decodes the rows it uses
  /// (te/nn/block_weights.h); the model then serves inference only. true, or under a mesh: every
  /// weight dequantized to float32 on load, to train, save, shard or hold in FP8.
  bool dequantize_gguf = false;
  /// load_causal_lm: build the model for packed sequences (CausalLMConfig::packed_sequences),
  /// to train on packed rows.
  bool packed_sequences = false;
  /// load_causal_lm: context parallelism in every layer (CausalLMConfig::cp_comm_type), and the
  /// load-balanced order of the tokens (CausalLMConfig::cp_load_balanced) where it keeps training
  /// one process's (cp_load_balance_is_exact; contiguous chunks otherwise: read the loaded
  /// config's cp_load_balanced for which).
  std::optional<nn::CpCommType> cp_comm_type;
  bool cp_load_balanced = false;
};

/// Where each te parameter of a model comes from in a Hugging Face checkpoint: one or more
/// tensors, each (transposed, for the kernels te keeps as [in, out]) into a slot of a stacked
/// dim (K and V into kv_kernel, gate and up into wi_kernel), or the whole parameter.
struct HfSource {
  std::string name;  ///< the checkpoint's tensor, e.g. "model.layers.0.self_attn.k_proj.weight"
  int64_t slot_dim = -1;   ///< the te parameter's stacked dim, or -1
  int64_t slot = 0;        ///< which entry of it this tensor is
  bool transpose = false;  ///< the te parameter is this 2-D tensor transposed
  /// A part of the checkpoint's tensor only: narrow_length entries of its dim narrow_dim from
  /// narrow_start, narrow_step apart, of a whole extent narrow_total (GPT-2's c_attn [hidden,
  /// 3 x hidden] holds the query, key and value slots of te's fused qkv_kernel, step 1;
  /// gpt-oss's gate_up_proj its gate in the even columns, up in the odd ones, step 2). -1: the
  /// whole tensor.
  int64_t narrow_dim = -1;
  int64_t narrow_start = 0, narrow_length = 0, narrow_total = 0;
  /// The entry of the te parameter's dim 0 this tensor fills (a mixture of experts' experts,
  /// stacked first: "model.layers.0.mlp.experts.3.up_proj.weight" into wi_kernel[3]), or -1;
  /// slot_dim and transpose then apply to that entry.
  int64_t expert = -1;
  int64_t narrow_step = 1;  ///< see narrow_dim
};
/// A model's te parameter name -> the checkpoint tensors it is made of.
using WeightMap = std::map<std::string, std::vector<HfSource>>;

/// Whole te tensors (parameters, or their gradients) by te name -> the checkpoint's tensors by
/// its names (the inverse of `map`): for comparing with, or saving as, Hugging Face. te::Error
/// naming a parameter `te_whole` lacks.
std::map<std::string, at::Tensor> to_hf_tensors(const WeightMap& map,
                                                const std::map<std::string, at::Tensor>& te_whole);

}  // namespace te::hf
