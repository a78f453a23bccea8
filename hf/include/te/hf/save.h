#pragma once

// A trained te::hf::CausalLM saved as Hugging Face files: config.json and model.safetensors under
// the checkpoint's own tensor names (the inverse of load_causal_lm's weight map), which
// transformers' from_pretrained, te::hf::load_causal_lm and te-serve read; or, for a model
// loaded from a GGUF file, as a GGUF file like it (F32, F16, BF16 or Q8_0) that llama.cpp reads.
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

/// Collective: writes `path`, a GGUF file with the metadata of `source_gguf` (the file the model
/// was loaded from: tokenizer, chat template, architecture keys; its quantize.* keys dropped and
/// general.file_type set) and `model`'s weights under llama.cpp's names, 2-D ones as `type`
/// ("f32", "f16", "bf16" or "q8_0"; a row that is not whole Q8_0 blocks as f16), 1-D ones as
/// f32. te::Error naming the type, the file when its architecture is not one te-cpp writes or
/// its sizes are not the model's, a weight without a llama.cpp name, and the path when it cannot
/// be written.
void save_gguf(const CausalLMImpl& model, const std::string& source_gguf, const std::string& path,
               const std::string& type = "f16");

}  // namespace te::hf
