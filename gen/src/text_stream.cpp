// te::gen::TextStream: generated tokens to final text, a character held back until its last
// byte comes, and the stop strings found across token boundaries; generate(), which runs
// requests to the end on an Engine.

#include "te/gen/text_stream.h"

#include <algorithm>
#include <map>

#include "te/error.h"
#include "te/gen/generate.h"

namespace te::gen {

TextStream::TextStream(std::shared_ptr<const Detokenizer> tokenizer, std::vector<std::string> stop)
    : tokenizer_(std::move(tokenizer)), stop_(std::move(stop)) {
  TE_CHECK(tokenizer_ != nullptr, "TextStream: no tokenizer");
  for (const std::string& s : stop_) TE_CHECK(!s.empty(), "TextStream: a stop string is empty");
}

namespace {
// U+FFFD, what a decoder gives for a character whose bytes are not all there.
const std::string kReplacement = "\xEF\xBF\xBD";
}  // namespace

std::string TextStream::decoded() {
  // The new ids are decoded after a few settled ones, and what those alone decode to is cut off
  // the front: a decoder that treats its first token specially (SentencePiece's leading space,
  // a Strip decoder) treats the same token alike in both. Where the shorter text is not the
  // front of the longer (a decoder whose output is not local), the whole text is decoded.
  constexpr std::size_t kContext = 4;
  std::string full;
  if (settled_ <= kContext) {
    full = tokenizer_->decode(ids_, /*skip_special_tokens=*/true);
  } else {
    const auto from = ids_.begin() + static_cast<std::ptrdiff_t>(settled_ - kContext);
    const std::string before = tokenizer_->decode(
        {from, ids_.begin() + static_cast<std::ptrdiff_t>(settled_)}, /*skip_special_tokens=*/true);
    const std::string after = tokenizer_->decode({from, ids_.end()}, /*skip_special_tokens=*/true);
    full = after.compare(0, before.size(), before) == 0
               ? settled_text_ + after.substr(before.size())
               : tokenizer_->decode(ids_, /*skip_special_tokens=*/true);
  }
  if (full.size() < kReplacement.size() ||
      full.compare(full.size() - kReplacement.size(), kReplacement.size(), kReplacement) != 0) {
    settled_ = ids_.size();
    settled_text_ = full;
  }
  return full;
}

std::string TextStream::push(int64_t token) {
  if (stopped_) return "";
  ids_.push_back(token);
  const std::string full = decoded();
  // The earliest stop string ends the text.
  std::size_t stop_at = std::string::npos;
  for (const std::string& s : stop_) {
    const std::size_t from = emitted_.size() >= s.size() ? emitted_.size() - s.size() + 1 : 0;
    stop_at = std::min(stop_at, full.find(s, from));
  }
  std::size_t safe = full.size();
  if (stop_at != std::string::npos) {
    stopped_ = true;
    safe = stop_at;
  } else {
    // Hold back an incomplete character (decoded as U+FFFD) and a possible stop string's start.
    while (safe >= kReplacement.size() &&
           full.compare(safe - kReplacement.size(), kReplacement.size(), kReplacement) == 0) {
      safe -= kReplacement.size();
    }
    const std::size_t end = safe;
    for (const std::string& s : stop_) {
      for (std::size_t k = std::min(s.size() - 1, end); k > 0; --k) {
        if (full.compare(end - k, k, s, 0, k) == 0) {
          safe = std::min(safe, end - k);
          break;
        }
      }
    }
  }
  if (safe <= emitted_.size()) return "";
  std::string out = full.substr(emitted_.size(), safe - emitted_.size());
  emitted_ += out;
  return out;
}

std::string TextStream::finish() {
  if (stopped_ || ids_.empty()) return "";
  const std::string full = tokenizer_->decode(ids_, /*skip_special_tokens=*/true);
  if (full.size() <= emitted_.size()) return "";
  std::string out = full.substr(emitted_.size());
  emitted_ += out;
  return out;
}

std::vector<Generated> generate(ModelRef model, const std::vector<std::vector<int64_t>>& prompts,
                                const GenerateOptions& options, const EngineOptions& engine_options,
                                const std::function<void(const TokenEvent&)>& on_token) {
  Engine engine(std::move(model), engine_options);
  std::map<int64_t, std::size_t> index;
  for (std::size_t i = 0; i < prompts.size(); ++i) index[engine.add(prompts[i], options)] = i;
  std::vector<Generated> out(prompts.size());
  while (!engine.idle()) {
    for (TokenEvent& e : engine.step()) {
      Generated& g = out[index.at(e.request)];
      g.tokens.push_back(e.token);
      g.logprobs.push_back(e.logprob);
      g.top_logprobs.push_back(e.top_logprobs);
      g.finish_reason = e.finish_reason;
      g.text += e.text;
      if (on_token) {
        TokenEvent shown = e;
        shown.request = static_cast<int64_t>(index.at(e.request));
        on_token(shown);
      }
    }
  }
  return out;
}

}  // namespace te::gen
