#pragma once

// te-serve's request decoder (no tensors): the bodies of POST /v1/classify, POST
// /v1/embeddings, POST /v1/completions and POST /v1/chat/completions, checked before any work is
// queued. The fuzz target fuzz/fuzz_request.cpp feeds it.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace serve {

/// A request the server answers with an HTTP error: the status and a sentence naming the problem.
struct HttpError : std::runtime_error {
  HttpError(int status_, const std::string& message, std::string param_ = "")
      : std::runtime_error(message), status(status_), param(std::move(param_)) {}
  int status;
  std::string param;  ///< the request field at fault, when one is (OpenAI's error "param")
};

/// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past
/// U+10FFFF).
bool valid_utf8(std::string_view text);

/// The sentences of a `POST /v1/classify` body: {"sentences": ["...", ...]}. HttpError 400 for a
/// body that is not UTF-8 or not JSON, a missing "sentences", one that is not a non-empty list of
/// strings, or an empty sentence (each message names the field or the index); 413 for more than
/// `max_sentences`.
std::vector<std::string> decode_classify(std::string_view body, std::size_t max_sentences);

/// A `POST /v1/embeddings` body (OpenAI's): the texts and the encoding asked for.
struct EmbeddingsRequest {
  std::vector<std::string> input;
  bool base64 = false;  ///< encoding_format "base64" (default "float")
};
/// {"input": "..." | ["...", ...], "model"?, "encoding_format"?: "float" | "base64",
/// "dimensions"?, "user"?}. HttpError 400 for a body that is not UTF-8 or not JSON, an input
/// that is not a non-empty string or list of them (token-id arrays included: send text), another
/// encoding_format, dimensions other than the model's `dimensions` (te-cpp does not shorten
/// embeddings), an unknown field; 413 for more than `max_inputs` texts.
EmbeddingsRequest decode_embeddings(std::string_view body, std::size_t max_inputs,
                                    int64_t dimensions);

/// One message of a chat completion request.
struct Message {
  std::string role;  ///< "system", "user" or "assistant" ("developer" is read as "system")
  std::string content;
};

/// A `POST /v1/completions` or `POST /v1/chat/completions` body (OpenAI's), checked: the prompt
/// and how to generate. Fields OpenAI defines that te-serve does not implement are refused when
/// they ask for something (n > 1, best_of > 1, echo, suffix, logit_bias, tools, a
/// response_format other than text); unknown fields are ignored, as OpenAI's API does. A
/// sampling field left out takes the model's default (te::hf::GenerationDefaults::sampling), as
/// vLLM and llama-server do, not OpenAI's temperature 1. vLLM's extensions top_k, min_p, repetition_penalty, ignore_eos and stop_token_ids
/// are read; those it does not implement (min_tokens, guided decoding, prompt_logprobs, ...) are
/// refused when they ask for something.
struct CompletionRequest {
  bool chat = false;
  std::string prompt;               ///< completions: the text to continue
  std::vector<int64_t> prompt_ids;  ///< completions: token ids instead of text
  std::vector<Message> messages;    ///< chat
  std::string model;
  std::optional<int64_t> max_tokens;  ///< unset: completions 16 (OpenAI's), chat: the context
  std::string max_tokens_field = "max_tokens";  ///< the field that gave it (chat: or
                                                ///< max_completion_tokens)
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<double> presence_penalty, frequency_penalty;  ///< OpenAI's, in [-2, 2]
  std::optional<int64_t> top_k;                               ///< 0 (or -1): all
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;  ///< at most 4, none empty
  std::vector<int64_t> stop_token_ids;
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;  ///< stream_options.include_usage
  /// The log-probabilities asked for: -1 none; otherwise the chosen token's and this many top
  /// alternatives (completions: "logprobs": N <= 5; chat: "logprobs": true, "top_logprobs": N
  /// <= 20).
  int64_t logprobs = -1;
};
/// HttpError 400 naming the field (param) for a body that is not UTF-8 or not a JSON object, a
/// missing prompt or messages, a field of the wrong type or out of range, an unsupported value.
CompletionRequest decode_completion(std::string_view body, bool chat);

/// Standard base64 (RFC 4648, with padding) of `bytes`.
std::string base64_encode(std::string_view bytes);

}  // namespace serve
