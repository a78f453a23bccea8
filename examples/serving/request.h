#pragma once

// te-serve's request decoder (no tensors): the bodies of POST /v1/classify and POST
// /v1/embeddings, checked before any work is queued. The fuzz target fuzz/fuzz_request.cpp
// feeds it.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace serve {

/// A request the server answers with an HTTP error: the status and a sentence naming the problem.
struct HttpError : std::runtime_error {
  HttpError(int status_, const std::string& message)
      : std::runtime_error(message), status(status_) {}
  int status;
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

/// Standard base64 (RFC 4648, with padding) of `bytes`.
std::string base64_encode(std::string_view bytes);

}  // namespace serve
