#pragma once

// A trained te::hf::CausalLM saved as Hugging Face files: config.json and model.safetensors under
// the checkpoint's own tensor names (the inverse of load_causal_lm's weight map), which
// transformers' from_pretrained, te::hf::load_causal_lm and te-serve read.
//
// Example (every rank calls it; rank 0 writes):
//   te::hf::save_causal_lm(*model, "out/", config_json_text);

#include <string>

#include "te/hf/causal_lm.h"

namespace te::hf {

/// Collective over the mesh the parameters are sharded on: gathers each parameter whole, maps it
/// to the checkpoint's names and writes `dir`/model.safetensors (the parameters' dtype) and
/// `dir`/config.json (`config_json`, the model's own config text, with "torch_dtype" and "dtype"
/// set to the parameters' dtype), creating `dir`. te::Error naming the path when it cannot be
/// written or `config_json` is not a JSON object, and for a model holding GGUF blocks (load it
/// with dequantize_gguf to save it).
void save_causal_lm(const CausalLMImpl& model, const std::string& dir,
                    const std::string& config_json);

}  // namespace te::hf
