// te::hf::Tokenizer on one piece of text (what the added tokens leave between them): BERT's
// normalizer and pre-tokenizer with WordPiece, or the byte-level pre-tokenizers with BPE. The
// semantics follow tokenizers 0.23.3 (normalizers/bert.rs, pre_tokenizers/bert.rs,
// models/wordpiece/mod.rs).

#include <algorithm>

#include "te/error.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace te::hf {
namespace detail {

namespace {

// The CJK ideograph blocks BERT pads with spaces (normalizers/bert.rs is_chinese_char).
bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// bert.rs: tab, newline and carriage return are whitespace, not control characters; a control
// character is removed before whitespace becomes a space (so U+000B, U+000C, U+0085 vanish).
bool bert_whitespace(char32_t c) {
  return c == U'\t' || c == U'\n' || c == U'\r' || detail::is_white_space(c);
}
bool bert_control(char32_t c) {
  return c != U'\t' && c != U'\n' && c != U'\r' && detail::is_other_8(c);
}
// pre_tokenizers/bert.rs is_bert_punc: ASCII punctuation (which includes symbols such as $ + <
// = > ^ ` | ~) or Unicode punctuation.
bool bert_punctuation(char32_t c) {
  const bool ascii = (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
                     (c >= 123 && c <= 126);
  return ascii || detail::is_punctuation_8(c);
}

}  // namespace

std::u32string normalize(const BertNormalizer& n, const std::u32string& in) {
  std::u32string s;
  s.reserve(in.size());
  for (char32_t c : in) {
    if (n.clean_text) {
      if (c == 0 || c == 0xFFFD || bert_control(c)) continue;
      if (bert_whitespace(c)) c = U' ';
    }
    if (n.handle_chinese_chars && is_chinese_char(c)) {
      s += U' ';
      s += c;
      s += U' ';
    } else {
      s += c;
    }
  }
  if (n.strip_accents.value_or(n.lowercase)) {
    std::u32string stripped;
    for (char32_t c : detail::nfd_9(s)) {
      if (!detail::is_nonspacing_mark_8(c)) stripped += c;
    }
    s = std::move(stripped);
  }
  if (n.lowercase) {
    std::u32string lower;
    lower.reserve(s.size());
    for (char32_t c : s) detail::append_lowercase(lower, c);
    s = std::move(lower);
  }
  return s;
}

// BertPreTokenizer: split on whitespace (dropped), every punctuation character a word alone.
std::vector<std::u32string> bert_words(const std::u32string& s) {
  std::vector<std::u32string> words;
  std::u32string word;
  auto flush = [&] {
    if (!word.empty()) words.push_back(std::move(word));
    word.clear();
  };
  for (char32_t c : s) {
    if (detail::is_white_space(c)) {  // Rust's char::is_whitespace
      flush();
    } else if (bert_punctuation(c)) {
      flush();
      words.push_back(std::u32string(1, c));
    } else {
      word += c;
    }
  }
  flush();
  return words;
}

}  // namespace detail

void Tokenizer::Impl::add_word_piece(const std::u32string& word, std::vector<int64_t>& out) const {
  if (static_cast<int64_t>(word.size()) > max_input_chars_per_word) {
    out.push_back(unk_id);
    return;
  }
  // Greedy longest match first; one piece that matches nothing makes the whole word unknown.
  std::vector<int64_t> pieces;
  std::size_t start = 0;
  while (start < word.size()) {
    std::size_t end = word.size();
    int64_t found = -1;
    while (start < end) {
      std::string piece = start > 0 ? prefix : std::string();
      piece += detail::to_utf8(std::u32string_view(word).substr(start, end - start));
      const auto it = vocab.find(piece);
      if (it != vocab.end()) {
        found = it->second;
        break;
      }
      --end;
    }
    if (found < 0) {
      out.push_back(unk_id);
      return;
    }
    pieces.push_back(found);
    start = end;
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

void Tokenizer::Impl::add_text(std::string_view raw, std::vector<int64_t>& out) const {
  if (raw.empty()) return;
  detail::utf8_to_code_points(raw, "tokenizer: encode");  // UTF-8, or an error naming the byte
  const std::string edited = detail::apply_edits(edits, std::string(raw));
  const std::string_view text = edited;
  if (text.empty()) return;
  if (bpe) {
    std::vector<std::string> pieces = {std::string(text)};
    for (const PreStep& step : pre_steps) {
      std::vector<std::string> next;
      for (std::string& piece : pieces) {
        if (step.add_prefix_space && piece.rfind(' ', 0) != 0) piece.insert(0, " ");
        std::vector<std::string> parts =
            step.split ? step.split->isolate(piece) : std::vector<std::string>{piece};
        for (std::string& part : parts) {
          next.push_back(step.byte_level ? detail::to_byte_level(part) : std::move(part));
        }
      }
      pieces = std::move(next);
    }
    for (const std::string& piece : pieces) bpe->encode(piece, out);
    return;
  }
  std::u32string s = detail::utf8_to_code_points(text, "tokenizer: encode");
  if (normalizer) s = detail::normalize(*normalizer, s);
  const std::vector<std::u32string> words =
      bert_pre_tokenizer ? detail::bert_words(s) : std::vector<std::u32string>{s};
  for (const std::u32string& w : words) add_word_piece(w, out);
}

}  // namespace te::hf
