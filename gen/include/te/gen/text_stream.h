#pragma once

// Generated tokens as text, as it becomes final, and stop strings found across token
// boundaries. The Engine runs one per request when it has a tokenizer (EngineOptions::tokenizer):
// TokenEvent::text is what this returns. No LibTorch.

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "te/gen/detokenizer.h"

namespace te::gen {

/// A character whose bytes are not all there yet, or an end that could begin a stop string, is
/// held back until the next tokens settle it. A stop string ends the text before it (OpenAI's
/// `stop`: the stop string is not returned). Each token costs a decode of itself and a few
/// tokens before it, not of the whole text: the text up to the last whole character is kept.
class TextStream {
 public:
  explicit TextStream(std::shared_ptr<const Detokenizer> tokenizer,
                      std::vector<std::string> stop = {});
  /// A copy of `tokenizer` (e.g. a te::hf::Tokenizer, which shares its tables).
  template <class T, std::enable_if_t<std::is_base_of_v<Detokenizer, T>, int> = 0>
  explicit TextStream(T tokenizer, std::vector<std::string> stop = {})
      : TextStream(std::make_shared<const T>(std::move(tokenizer)), std::move(stop)) {}
  /// Adds a generated token; returns the text that is now final ("" once stopped).
  std::string push(int64_t token);
  /// The text still held back, when generation has ended without a stop string.
  std::string finish();
  /// A stop string has appeared (the text before it has been returned).
  bool stopped() const { return stopped_; }
  /// Everything returned so far.
  const std::string& text() const { return emitted_; }

 private:
  /// The text of every id so far (decode(ids_)), from the settled text and a decode of the ids
  /// after it; settles it again where the text ends in a whole character.
  std::string decoded();

  std::shared_ptr<const Detokenizer> tokenizer_;
  std::vector<std::string> stop_;
  std::vector<int64_t> ids_;
  std::string emitted_;
  /// ids_[0, settled_) decode to settled_text_, which ends in a whole character.
  std::size_t settled_ = 0;
  std::string settled_text_;
  bool stopped_ = false;
};

}  // namespace te::gen
