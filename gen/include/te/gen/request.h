#pragma once

// One generation request: what GenerateOptions asks for, and its check, written once.
// te::gen::Engine::add refuses a request with check_request; te-serve asks request_problem
// before it queues one, to answer 400 naming the field. No LibTorch.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "te/gen/sampling.h"

namespace te::gen {

/// One request.
struct GenerateOptions {
  /// Tokens to generate at most (the stop token not counted).
  int64_t max_tokens = 16;
  SamplingOptions sampling;
  /// Generation stops when one of these is drawn (it is reported, finish_reason "stop").
  std::vector<int64_t> stop_token_ids;
  /// Log-probabilities (log_softmax of the model's logits, before the sampling filters) of the
  /// chosen token and of the `top_logprobs` most likely ones.
  int64_t top_logprobs = 0;
  /// OpenAI's `stop`: generation stops, finish_reason "stop", in the step whose token completes
  /// one of these in the text; the text before it is the last returned (TokenEvent::text), the
  /// stop string is not. Needs the Engine's tokenizer (EngineOptions::tokenizer).
  std::vector<std::string> stop;
};

/// What a request is checked against.
struct RequestLimits {
  /// Token ids (the prompt's, stop_token_ids) are in [0, vocab_size).
  int64_t vocab_size = 0;
  /// The prompt and the generated tokens together at most.
  int64_t max_sequence_length = 0;
  /// How messages name max_sequence_length: "" the Engine's own ("max_sequence_length 64"), or
  /// a server's ("this server's context": "... of this server's context of 64").
  std::string context;
  /// max_tokens must fit beside the prompt (OpenAI's rule, te-serve's); otherwise generation
  /// ends where the context does, finish_reason "length".
  bool max_tokens_within_context = false;
  /// The request's name for max_tokens (a chat request's may be "max_completion_tokens").
  std::string max_tokens_field = "max_tokens";
};

/// The request's first problem (the field at fault, "prompt" for the prompt, and what is wrong),
/// or none: an empty prompt, a token id outside the vocabulary, a prompt that leaves no room to
/// generate, max_tokens < 1 (or past the context, when the limits say so), top_logprobs outside
/// [0, 20], a sampling field out of range (sampling_problem), an empty stop string.
std::optional<BadField> request_problem(const std::vector<int64_t>& prompt,
                                        const GenerateOptions& options,
                                        const RequestLimits& limits);
/// te::Error "`who`: " and request_problem's message, when there is one.
void check_request(const std::vector<int64_t>& prompt, const GenerateOptions& options,
                   const RequestLimits& limits, const std::string& who);

}  // namespace te::gen
