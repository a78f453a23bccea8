#pragma once

// What every route of te-serve decodes with (no tensors): the error a request is answered with,
// UTF-8 and base64, and te's own POST /v1/classify body, checked before any work is queued. The
// OpenAI routes' bodies are openai.h's. The fuzz target fuzz/fuzz_request.cpp feeds both.

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace te::serve {

/// A request the server answers with an HTTP error: the status and a sentence naming the problem.
struct HttpError : std::runtime_error {
  HttpError(int status_, const std::string& message, std::string param_ = "",
            std::string code_ = "")
      : std::runtime_error(message),
        status(status_),
        param(std::move(param_)),
        code(std::move(code_)) {}
  int status;
  std::string param;  ///< the request field at fault, when one is (OpenAI's error "param")
  std::string code;   ///< OpenAI's error "code" ("model_not_found", ...), "" for null
};

/// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code points past
/// U+10FFFF).
bool valid_utf8(std::string_view text);

/// The sentences of a `POST /v1/classify` body: {"sentences": ["...", ...]}. HttpError 400 for a
/// body that is not UTF-8 or not JSON, a missing "sentences", one that is not a non-empty list of
/// strings, or an empty sentence (each message names the field or the index); 413 for more than
/// `max_sentences`.
std::vector<std::string> decode_classify(std::string_view body, std::size_t max_sentences);

/// Standard base64 (RFC 4648, with padding) of `bytes`.
std::string base64_encode(std::string_view bytes);

}  // namespace te::serve
