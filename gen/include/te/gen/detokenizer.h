#pragma once

// What generation needs of a tokenizer: token ids back to text. te::gen's TextStream and the
// Engine's stop strings decode through it; te::hf::Tokenizer implements it. No LibTorch.

#include <cstdint>
#include <string>
#include <vector>

namespace te::gen {

class Detokenizer {
 public:
  virtual ~Detokenizer() = default;
  /// The text of `ids` (the model's decoder: bytes of a character split across tokens come out
  /// as U+FFFD until its last byte is there); special tokens left out when skip_special_tokens.
  /// Called from the thread that steps an Engine, beside other threads' calls: it must be safe to
  /// call concurrently.
  virtual std::string decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const = 0;

 protected:
  Detokenizer() = default;
  Detokenizer(const Detokenizer&) = default;
  Detokenizer& operator=(const Detokenizer&) = default;
};

}  // namespace te::gen
