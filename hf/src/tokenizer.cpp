// te::hf::Tokenizer: tokenizer.json (or BERT's vocab.txt) read strictly, and the encode/decode
// pipeline of Hugging Face tokenizers: added tokens split off the raw text, then per piece the
// normalizer, the pre-tokenizer and the model, then truncation and the post-processor's
// template. The semantics follow tokenizers 0.23.3 (tokenizers/src/normalizers/bert.rs,
// pre_tokenizers/bert.rs, models/wordpiece/mod.rs, decoders/wordpiece.rs, processors/template.rs,
// tokenizer/added_vocabulary.rs); tests/interop/check_tokenizers.py holds every id to it.

#include "te/hf/tokenizer.h"

#include <algorithm>
#include <iterator>

#include "te/error.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace te::hf {

// ---------------------------------------------------------------------------------------------
// Encoding and decoding

Encoding Tokenizer::encode(std::string_view text, const EncodeOptions& options) const {
  const Impl& t = *impl_;
  std::vector<int64_t> content;
  // Added tokens first, on the raw text: at each position the longest that matches.
  std::size_t from = 0;
  for (std::size_t at = 0; at < text.size();) {
    const AddedToken* hit = nullptr;
    for (const AddedToken& a : t.added) {
      if (text.compare(at, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++at;
      continue;
    }
    t.add_text(text.substr(from, at - from), content);
    content.push_back(hit->id);
    at += hit->content.size();
    from = at;
  }
  t.add_text(text.substr(from), content);

  Encoding e;
  int64_t specials = 0;
  if (options.add_special_tokens) {
    for (const TemplatePiece& p : t.single) {
      if (!p.sequence) specials += static_cast<int64_t>(p.ids.size());
    }
  }
  TE_CHECK(options.max_length >= 0, "tokenizer: max_length ", options.max_length,
           " is negative; give 0 for no limit");
  if (options.max_length > 0) {
    TE_CHECK(options.max_length >= specials, "tokenizer: max_length ", options.max_length,
             " leaves no room for the ", specials, " special tokens");
    const int64_t room = options.max_length - specials;
    if (static_cast<int64_t>(content.size()) > room) {
      content.resize(static_cast<std::size_t>(room));
      e.truncated = true;
    }
  }
  if (!options.add_special_tokens || t.single.empty()) {
    e.ids = content;
    e.type_ids.assign(content.size(), 0);
    return e;
  }
  for (const TemplatePiece& p : t.single) {
    const std::vector<int64_t>& ids = p.sequence ? content : p.ids;
    e.ids.insert(e.ids.end(), ids.begin(), ids.end());
    e.type_ids.insert(e.type_ids.end(), ids.size(), p.type_id);
  }
  return e;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  // tokenizer/mod.rs decode: special tokens left out first, then the decoder over the rest.
  std::vector<std::string> tokens;
  for (int64_t id : ids) {
    std::string token = id_to_token(id);
    if (skip_special_tokens && t.is_special[static_cast<std::size_t>(id)]) continue;
    tokens.push_back(std::move(token));
  }
  if (t.decoder == Decoder::kSteps) return detail::run_decode_steps(t.decode_steps, tokens);
  std::string out;
  if (t.decoder == Decoder::kByteLevel) {
    for (const std::string& token : tokens) out += detail::from_byte_level(token);
    return detail::utf8_lossy(out);
  }
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const std::string& token = tokens[i];
    if (t.decoder == Decoder::kNone) {  // tokens joined by spaces
      out += (i == 0 ? "" : " ") + token;
      continue;
    }
    std::string piece;
    if (i != 0 && token.rfind(t.decoder_prefix, 0) == 0) {
      piece = token.substr(t.decoder_prefix.size());
    } else {
      piece = i == 0 ? token : " " + token;
    }
    if (t.decoder_cleanup) {
      // decoders/wordpiece.rs cleanup, per token: spaces before punctuation and contractions.
      static const std::vector<std::pair<std::string, std::string>> kCleanup = {
          {" .", "."},   {" ?", "?"},     {" !", "!"},    {" ,", ","},
          {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},  {" do not", " don't"},
          {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
      for (const auto& [from_text, to_text] : kCleanup) {
        for (std::size_t at = piece.find(from_text); at != std::string::npos;
             at = piece.find(from_text, at + to_text.size())) {
          piece.replace(at, from_text.size(), to_text);
        }
      }
    }
    out += piece;
  }
  return out;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->tokens.size()); }

std::optional<int64_t> Tokenizer::token_to_id(const std::string& token) const {
  const auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::id_to_token(int64_t id) const {
  TE_CHECK(id >= 0 && id < vocab_size(), "tokenizer: id ", id, " is outside the vocabulary [0, ",
           vocab_size(), ")");
  return impl_->tokens[static_cast<std::size_t>(id)];
}

int64_t Tokenizer::pad_id() const { return impl_->pad_id; }

}  // namespace te::hf
