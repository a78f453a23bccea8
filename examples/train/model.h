#pragma once

// te-train's model: opened from --model (a Hugging Face directory or a GGUF file, fine-tuned) or
// built at random from --config with --tokenizer; what the run prints about it; its export as
// Hugging Face files (--export-hf).

#include <cstdint>
#include <optional>
#include <string>

#include "args.h"
#include "te/gen/chat_template.h"
#include "te/hf/causal_lm.h"
#include "te/hf/tokenizer.h"
#include "te/train/data.h"

namespace train {

struct OpenedModel {
  te::hf::CausalLM model{nullptr};
  std::optional<te::hf::Tokenizer> tokenizer;
  /// The model's config.json text ("" for a GGUF file).
  std::string config;
  int64_t eos_id = -1;
  /// The model's chat template when te-cpp knows its family (chat data needs it).
  std::optional<te::gen::ChatTemplate> chat_template;
};

/// Under the mesh and rules in scope. te::InputError naming the option for a model, config or
/// tokenizer that cannot be read or has no EOS token.
OpenedModel open_model(const Args& args);

/// The run's banner (rank 0).
void print_banner(const Args& args, const OpenedModel& m, const te::train::Data& data,
                  int world_size, int64_t micro_batches);

/// Collective: --export-hf DIR gets config.json, model.safetensors and the tokenizer's files.
void export_hf(const Args& args, const OpenedModel& m, const te::hf::CausalLMImpl& model);

/// Collective: --export-gguf FILE, a GGUF file like the --model it was loaded from.
void export_gguf(const Args& args, const te::hf::CausalLMImpl& model);

}  // namespace train
