// libFuzzer target: te-serve's request decoder (POST /v1/classify, /v1/embeddings,
// /v1/completions and /v1/chat/completions bodies).
// Every body either decodes or throws HttpError 400/413 (the status te-serve answers with);
// anything else is a bug. What it accepts must be valid UTF-8 sentences (with words, for
// classify), at most the limit; base64 of what was accepted decodes to the same length.
//   bash scripts/fuzz.sh [seconds per target]
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "te/encoder/text.h"
#include "te/serve/openai.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  constexpr std::size_t kMax = 16;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  try {
    const std::vector<std::string> sentences = te::serve::decode_classify(body, kMax);
    if (sentences.empty() || sentences.size() > kMax) __builtin_trap();
    for (const std::string& s : sentences) {
      if (!te::serve::valid_utf8(s) || encoder::tokenize(s).empty()) __builtin_trap();
    }
  } catch (const te::serve::HttpError& e) {
    if (e.status != 400 && e.status != 413) __builtin_trap();
  }
  try {
    const te::serve::EmbeddingsRequest r = te::serve::decode_embeddings(body, kMax, 384);
    if (r.input.empty() || r.input.size() > kMax) __builtin_trap();
    for (const std::string& s : r.input) {
      if (!te::serve::valid_utf8(s)) __builtin_trap();
      if (te::serve::base64_encode(s).size() != (s.size() + 2) / 3 * 4) __builtin_trap();
    }
  } catch (const te::serve::HttpError& e) {
    if (e.status != 400 && e.status != 413) __builtin_trap();
  }
  for (const bool chat : {false, true}) {
    try {
      const te::serve::CompletionRequest r = te::serve::decode_completion(body, chat);
      if (chat ? r.messages.empty() : r.prompt.empty() && r.prompt_ids.empty()) __builtin_trap();
      // Sampling fields left out stay unset (the model's defaults apply); given ones are in range.
      auto within = [](const std::optional<double>& v, double lo, double hi, bool lo_open) {
        return !v || ((lo_open ? *v > lo : *v >= lo) && *v <= hi);
      };
      if (r.stop.size() > 4 || !within(r.temperature, 0, 2, false)) __builtin_trap();
      if (!within(r.top_p, 0, 1, true) || (r.top_k && *r.top_k < 0) || r.logprobs > 20) {
        __builtin_trap();
      }
      if (!within(r.presence_penalty, -2, 2, false) || !within(r.frequency_penalty, -2, 2, false) ||
          !within(r.min_p, 0, 1, false)) {
        __builtin_trap();
      }
      if (r.max_tokens && *r.max_tokens < 1) __builtin_trap();
      if (r.include_usage && !r.stream) __builtin_trap();
      for (const te::serve::Message& m : r.messages) {
        if (!te::serve::valid_utf8(m.content)) __builtin_trap();
      }
    } catch (const te::serve::HttpError& e) {
      if (e.status != 400) __builtin_trap();
    }
  }
  return 0;
}
