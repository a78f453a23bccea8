#pragma once

// Byte-level BPE as Hugging Face tokenizers 0.23.3 runs it (models/bpe/model.rs,
// pre_tokenizers/byte_level.rs, pre_tokenizers/split.rs, decoders/byte_level.rs): GPT-2's byte
// alphabet, regex splitting (PCRE2 standing in for the Oniguruma tokenizers compiles), and the
// merges applied lowest rank first. tests/interop/check_tokenizers.py holds it to tokenizers.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace te::hf::detail {

/// A compiled regular expression (PCRE2, UTF-8 and Unicode properties) whose matches split text.
class SplitRegex {
 public:
  /// te::Error naming `where` and the pattern's error offset when it does not compile.
  SplitRegex(const std::string& pattern, const std::string& where);
  ~SplitRegex();
  SplitRegex(const SplitRegex&) = delete;
  SplitRegex& operator=(const SplitRegex&) = delete;
  /// `text` cut into its matches and the gaps between them, in order, none empty (tokenizers'
  /// Split with behaviour Isolated).
  std::vector<std::string> isolate(std::string_view text) const;

 private:
  void* code_ = nullptr;  // pcre2_code_8
  std::string where_;
};

/// GPT-2's pattern, which ByteLevel splits by when use_regex is set.
const std::string& gpt2_pattern();
/// Each byte of `text` as GPT-2's printable stand-in for it (bytes_to_unicode), UTF-8.
std::string to_byte_level(std::string_view text);
/// The bytes byte-level `token` stands for, or its own bytes when a character is not one of the
/// 256 stand-ins (tokenizers' ByteLevel decoder).
std::string from_byte_level(std::string_view token);
/// `bytes` as UTF-8 text, each maximal invalid sequence replaced by U+FFFD (Rust's
/// String::from_utf8_lossy).
std::string utf8_lossy(std::string_view bytes);

/// A BPE model's options (models/bpe/model.rs).
struct BpeOptions {
  bool ignore_merges = false;  ///< a word that is a token is taken whole
  /// A character the vocabulary lacks becomes the tokens of its bytes ("<0x41>") when they are
  /// all there; else the unknown token (consecutive ones fused into one with fuse_unk), else it
  /// is dropped.
  bool byte_fallback = false;
  std::optional<int64_t> unk;
  bool fuse_unk = false;
};

/// A BPE model: the vocabulary and the merges' ranks.
class Bpe {
 public:
  Bpe(const std::unordered_map<std::string, int64_t>& vocab,
      const std::vector<std::pair<std::string, std::string>>& merges, const BpeOptions& options,
      const std::string& where);
  /// The ids of one pre-token: its characters (or their bytes, or the unknown token, as the
  /// options say; else dropped, as tokenizers does), merged lowest rank first (leftmost on ties).
  /// O(n log n) in the word's characters: a queue of candidate merges, as tokenizers' word.rs.
  void encode(std::string_view word, std::vector<int64_t>& out) const;

 private:
  struct Pair {
    int64_t a, b;
    bool operator==(const Pair& o) const { return a == o.a && b == o.b; }
  };
  struct PairHash {
    std::size_t operator()(const Pair& p) const {
      return std::hash<int64_t>()(p.a) * 1000003u ^ std::hash<int64_t>()(p.b);
    }
  };
  struct Merge {
    int64_t rank, id;  // the merge's rank, the id of the token it makes
  };
  const std::unordered_map<std::string, int64_t>& vocab_;
  std::unordered_map<Pair, Merge, PairHash> merges_;  // (left id, right id) -> merge
  BpeOptions options_;
  std::vector<int64_t> byte_ids_;  // byte -> the id of "<0xHH>", -1 where the vocabulary lacks it
};

}  // namespace te::hf::detail
