// te::hf::CausalLM as the te::gen::LanguageModel an Engine drives: the numbers of its config
// (step and step_on_mesh are causal_lm.cpp's).

#include <c10/core/ScalarType.h>

#include <algorithm>

#include "te/hf/causal_lm.h"

namespace te::hf {

int64_t CausalLMImpl::vocab_size() const { return config.vocab_size; }

// LongRoPE: the original length, within which te-cpp's KV cache holds what transformers'
// generate computes (CausalLM::step refuses a sequence growing past it).
int64_t CausalLMImpl::max_positions() const {
  if (config.rope_long_freq_factors.empty()) return config.max_position_embeddings;
  return config.max_position_embeddings > 0 ? std::min(config.max_position_embeddings,
                                                       config.rope_original_max_position_embeddings)
                                            : config.rope_original_max_position_embeddings;
}

te::nn::InferenceParamsOptions CausalLMImpl::kv_cache_options(int64_t max_batch,
                                                              int64_t max_length) const {
  return cache_options(config, max_batch, max_length);
}

int64_t CausalLMImpl::kv_bytes_per_token(at::ScalarType dtype) const {
  return config.num_hidden_layers * config.num_key_value_heads * 2 * config.head_dim *
         static_cast<int64_t>(c10::elementSize(dtype));
}

}  // namespace te::hf
