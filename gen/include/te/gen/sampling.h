#pragma once

// How one request chooses its tokens: the options of te::gen::Sampler (generate.h), in a header
// of their own so that what reads a model's defaults (te/hf/chat.h) needs no LibTorch.

#include <cstdint>
#include <optional>
#include <string>

namespace te::gen {

/// How the next token is drawn from the logits, in transformers' order (generation/utils.py
/// _get_logits_processor, transformers 5.23.0): the repetition penalty (over the prompt and the
/// generated tokens: a positive logit divided by it, a negative one multiplied), OpenAI's
/// presence and frequency penalties (vLLM's order: before the temperature), then the
/// temperature, top-k, top-p and min-p filters, then a draw from the softmax. The struct's
/// defaults are OpenAI's API defaults (no filter); te-generate and te-serve start from the
/// model's own instead (te::hf::GenerationDefaults::sampling, te/hf/chat.h).
struct SamplingOptions {
  /// 0: greedy (the largest logit; ties go to the lowest id). Otherwise logits / temperature.
  double temperature = 1.0;
  /// Keep the k largest logits (ties with the k-th kept); 0: all.
  int64_t top_k = 0;
  /// Keep the smallest set of most likely tokens whose probabilities sum past top_p; 1: all.
  double top_p = 1.0;
  /// Drop tokens less likely than min_p times the most likely one; 0: none.
  double min_p = 0.0;
  /// 1: off. Over the prompt and the generated tokens (transformers'
  /// RepetitionPenaltyLogitsProcessor): a seen token's logit is divided by it (multiplied when
  /// negative).
  double repetition_penalty = 1.0;
  /// OpenAI's, in [-2, 2], 0: off. Over the generated tokens only (as vLLM applies them): a
  /// generated token's logit less presence_penalty once, and frequency_penalty times its count.
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  /// The request's own random stream: the same seed gives the same tokens whatever else is
  /// decoded beside it.
  uint64_t seed = 0;

  /// Greedy with no penalty: the largest logit as it is.
  bool is_greedy() const;
};

/// A field of a request that is out of its range: its name and what is wrong ("top_p",
/// "sampling.top_p 0 must be in (0, 1]").
struct BadField {
  std::string field;
  std::string message;
  /// "context_length_exceeded" when the prompt, or the prompt and max_tokens, do not fit the
  /// context (OpenAI's error code for it); else "".
  std::string code = "";
};

/// The first field of `options` out of its range (named `who`.field in the message), or none.
std::optional<BadField> sampling_problem(const SamplingOptions& options,
                                         const std::string& who = "sampling");
/// Checks every field (te::Error with sampling_problem's message).
void check_sampling(const SamplingOptions& options, const std::string& who = "sampling");

}  // namespace te::gen
