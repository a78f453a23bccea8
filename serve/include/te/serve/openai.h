#pragma once

// OpenAI's API as te-serve speaks it, in one place: the bodies of POST /v1/embeddings, POST
// /v1/completions and POST /v1/chat/completions decoded and checked before any work is queued
// (openai_requests.cpp), and the responses, server-sent events and error objects encoded
// (openai_responses.cpp). No tensors, no HTTP: routes.h moves these bytes.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "te/serve/request.h"

namespace te::serve {

struct Embeddings;       // service.h
class GenerationStream;  // generation.h
struct Piece;
struct TokenInfo;

// ---- requests ------------------------------------------------------------------------------

/// A `POST /v1/embeddings` body (OpenAI's): the texts and the encoding asked for.
struct EmbeddingsRequest {
  std::vector<std::string> input;
  bool base64 = false;  ///< encoding_format "base64" (default "float")
  std::string model;    ///< "" when not given
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
/// vLLM and llama-server do, not OpenAI's temperature 1. vLLM's extensions top_k, min_p,
/// repetition_penalty, ignore_eos and stop_token_ids are read; those it does not implement
/// (min_tokens, guided decoding, prompt_logprobs, ...) are refused when they ask for something.
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

// ---- responses -----------------------------------------------------------------------------

/// The body of a successful OpenAI embeddings response: {"object": "list", "data": [{"object":
/// "embedding", "index": i, "embedding": [floats] or base64 of little-endian float32}], "model",
/// "usage": {"prompt_tokens", "total_tokens"}}, and te's "truncated" list.
std::string encode_embeddings(const Embeddings& e, bool base64, const std::string& model);

/// The body of a finished (non-streaming) response: OpenAI's text_completion or
/// chat.completion object with its usage.
std::string encode_response(const GenerationStream& stream, const std::string& model,
                            const std::string& text, const std::vector<TokenInfo>& tokens,
                            const std::string& finish_reason);
/// One server-sent event ("data: {...}\n\n") of a streaming response: a piece of text (a chat
/// stream's first event also carries the assistant role), or the usage event (`usage_only`).
/// SseEvents puts them in order.
std::string encode_event(const GenerationStream& stream, const std::string& model,
                         const Piece& piece, bool first, bool usage_only = false);
/// OpenAI's error object: {"error": {"message", "type", "param", "code"}}, the type by the status
/// (invalid_request_error, as OpenAI's 404 model_not_found has it; server_error,
/// service_unavailable), code null when "".
std::string openai_error_body(int status, const std::string& message, const std::string& param,
                              const std::string& code = "");
/// The same for an HttpError.
std::string openai_error_body(const HttpError& e);

/// te-serve's system_fingerprint ("te-cpp-<version>"): which build answered, in every
/// completion.
const std::string& system_fingerprint();

/// The events of one streaming response, in OpenAI's order: a chat stream opens with the
/// assistant role alone (whatever the first piece holds: pieces may carry several tokens when the
/// client reads late); each piece is one event; the finish_reason comes in an event of its own
/// with an empty delta (text ""), as OpenAI's and llama-server's streams end, so a client that
/// stops reading content at finish_reason has every token; then the usage event when
/// stream_options.include_usage asked for it and "data: [DONE]".
class SseEvents {
 public:
  /// The bytes to write for `piece` of `stream`: "" while nothing is final yet (a character held
  /// back until its last byte comes).
  std::string next(const GenerationStream& stream, const std::string& model, const Piece& piece);

 private:
  bool first_ = true;
};

}  // namespace te::serve
