#pragma once

// What a model's files say about generating with it: its end-of-sequence tokens, its sampling
// defaults and its chat template (GGUF metadata tokenizer.ggml.eos_token_id, general.sampling.*
// and tokenizer.chat_template; a Hugging Face folder's generation_config.json / config.json
// eos_token_id and tokenizer_config.json's chat_template or chat_template.jinja).
// te::gen::ChatTemplate (te/gen/chat_template.h) applies the template.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "te/gen/sampling.h"

namespace te::hf {

/// The generation settings of a model folder or GGUF file.
struct GenerationDefaults {
  /// The tokens that end generation (eos_token_id, one or a list).
  std::vector<int64_t> eos_token_ids;
  /// The chat template as written ("" when the model has none).
  std::string chat_template;
  /// What a request that names no sampling option gets: each field the model's own file sets
  /// (generation_config.json: do_sample, temperature, top_k, top_p, min_p, repetition_penalty;
  /// a GGUF file's general.sampling.temp, .top_k, .top_p, .min_p, .penalty_repeat), the others
  /// llama.cpp's (llama_cpp_sampling()). do_sample false means greedy, as in transformers.
  te::gen::SamplingOptions sampling = llama_cpp_sampling();
  /// Where each field of `sampling` that is not llama.cpp's default came from, by field name
  /// ("temperature" -> "generation_config.json").
  std::vector<std::pair<std::string, std::string>> sampling_sources;

  /// llama.cpp's sampling defaults (common/common.h, common_params_sampling): temperature 0.8,
  /// top_k 40, top_p 0.95, min_p 0.05, no penalty.
  static te::gen::SamplingOptions llama_cpp_sampling();
};

/// Reads them from `dir_or_gguf`; te::Error naming a file that cannot be read or a field of the
/// wrong type or range.
GenerationDefaults read_generation_defaults(const std::string& dir_or_gguf);

/// "temperature 0.6, top_p 0.9 (generation_config.json); top_k 40, min_p 0.05 (llama.cpp's
/// defaults)": the sampling a request gets unless it says otherwise, and where it came from
/// (te-generate and te-serve print it when they start).
std::string describe_sampling(const GenerationDefaults& defaults);

}  // namespace te::hf
