#pragma once

// What save.cpp's save_causal_lm and save_gguf.cpp's save_gguf share.

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <string>

#include "te/hf/causal_lm.h"

namespace te::hf::detail {

/// Collective: every parameter of `model` whole (gathered where sharded), on the CPU, by te name.
/// te::Error (`what` names the caller) for weights held in GGUF blocks or parameters of two
/// dtypes.
std::map<std::string, at::Tensor> whole_parameters(const CausalLMImpl& model, const char* what);

/// Collective: `write` runs on rank 0; its error, if any, is thrown on every rank.
void on_rank_zero(const std::function<void()>& write);

/// te::Error naming `where` and the field when `given` describes another model than `model`:
/// other sizes, or (check_same_layers) layers that compute otherwise.
void check_same_sizes(const CausalLMConfig& given, const CausalLMConfig& model,
                      const std::string& where);
/// te::Error naming `where` and the field when `given`'s layers compute otherwise than `model`'s
/// (RoPE, windows, norms, scales, sinks, the activations and the experts' routing), which a file
/// written with `given` would make its readers run: a gpt-oss trained from a GGUF file, whose YaRN
/// is truncated, saved with its Hugging Face config.json, which says not.
void check_same_layers(const CausalLMConfig& given, const CausalLMConfig& model,
                       const std::string& where);

}  // namespace te::hf::detail
