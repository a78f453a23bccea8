#pragma once

// te::hf::Tokenizer's insides, shared by its parts: tokenizer_json.cpp reads tokenizer.json and
// vocab.txt into an Impl; tokenizer_pieces.cpp runs the normalizer, the pre-tokenizer and the
// model on one piece of text; tokenizer.cpp runs the whole pipeline (added tokens, truncation, the
// post-processor's template) and decodes.

#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "bpe.h"
#include "te/hf/tokenizer.h"

namespace te::hf {
namespace detail {

// BertNormalizer's options (normalizers/bert.rs).
struct BertNormalizer {
  bool clean_text = true, handle_chinese_chars = true, lowercase = true;
  std::optional<bool> strip_accents;  // nullopt: as lowercase
};

// The template's pieces: a special token (its ids) or the text's tokens, each with a type id.
struct TemplatePiece {
  bool sequence = false;
  std::vector<int64_t> ids;
  int64_t type_id = 0;
};

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool special = false;
};

// One pre-tokenizer step of a byte-level pipeline: a regex split (Split, Isolated; ByteLevel with
// use_regex) and, for ByteLevel, the bytes spelled in GPT-2's alphabet.
struct PreStep {
  std::shared_ptr<const detail::SplitRegex> split;  // null: no split
  bool byte_level = false;
  bool add_prefix_space = false;
};

// SentencePiece-style normalizers (normalizers/prepend.rs, replace.rs with a String pattern),
// applied in order to each piece of text between added tokens.
struct TextEdit {
  bool prepend = false;  // prepend `to` to a non-empty text; else replace each `from` by `to`
  std::string from, to;
};

// A decoder step over the tokens' strings (decoders/replace.rs, byte_fallback.rs, fuse.rs,
// strip.rs), as tokenizers' decode_chain runs them.
struct DecodeStep {
  enum class Kind { kReplace, kByteFallback, kFuse, kStrip } kind = Kind::kFuse;
  std::string from, to;         // Replace
  std::string content;          // Strip: the character stripped
  int64_t start = 0, stop = 0;  // Strip: at most this many from the start, from the end
};

enum class Decoder { kNone, kWordPiece, kByteLevel, kSteps };

/// Reads a normalizer of Prepend and Replace (String pattern) steps, alone or in a Sequence
/// (`what` prefixes the field names in errors); te::Error naming any other kind.
void read_text_edits(std::vector<TextEdit>& out, const nlohmann::json& n, const std::string& path,
                     const std::string& what);
/// Reads a decoder of Replace, ByteFallback, Fuse and Strip steps, alone or in a Sequence.
void read_decode_steps(std::vector<DecodeStep>& out, const nlohmann::json& d,
                       const std::string& path, const std::string& what);
/// `text` with the edits applied.
std::string apply_edits(const std::vector<TextEdit>& edits, std::string text);
/// The decoded text of `tokens` through the steps (their strings concatenated at the end).
std::string run_decode_steps(const std::vector<DecodeStep>& steps, std::vector<std::string> tokens);

/// BertNormalizer on code points (normalizers/bert.rs): clean text, Chinese characters spaced,
/// accents stripped, lowercased, as `n` says.
std::u32string normalize(const BertNormalizer& n, const std::u32string& in);
/// BertPreTokenizer (pre_tokenizers/bert.rs): split on whitespace, punctuation isolated.
std::vector<std::u32string> bert_words(const std::u32string& s);

}  // namespace detail

using detail::AddedToken;
using detail::BertNormalizer;
using detail::Decoder;
using detail::DecodeStep;
using detail::PreStep;
using detail::TemplatePiece;
using detail::TextEdit;

struct Tokenizer::Impl {
  std::string path;
  // The model: WordPiece (models/wordpiece/mod.rs), or BPE when `bpe` is set.
  std::unordered_map<std::string, int64_t> vocab;
  std::unique_ptr<detail::Bpe> bpe;
  std::vector<PreStep> pre_steps;   // BPE's pre-tokenizers
  std::vector<std::string> tokens;  // by id
  std::string unk_token = "[UNK]", prefix = "##";
  int64_t unk_id = -1, max_input_chars_per_word = 100;
  std::optional<BertNormalizer> normalizer;
  std::vector<TextEdit> edits;  // the other normalizers
  bool bert_pre_tokenizer = false;
  std::vector<TemplatePiece> single;
  std::vector<AddedToken> added;  // longest first
  std::vector<bool> is_special;   // by id
  Decoder decoder = Decoder::kNone;
  bool decoder_cleanup = true;
  std::string decoder_prefix = "##";
  std::vector<DecodeStep> decode_steps;  // Decoder::kSteps
  int64_t pad_id = 0;

  void add_word_piece(const std::u32string& word, std::vector<int64_t>& out) const;
  void add_text(std::string_view text, std::vector<int64_t>& out) const;
};

}  // namespace te::hf
