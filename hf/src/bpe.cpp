#include "bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <array>
#include <functional>
#include <queue>
#include <tuple>

#include "te/error.h"
#include "unicode.h"

namespace te::hf::detail {

namespace {

pcre2_code* code(void* p) { return static_cast<pcre2_code*>(p); }

// GPT-2's bytes_to_unicode (pre_tokenizers/byte_level.rs bytes_char): the printable bytes stand
// for themselves, the other 68 for U+0100 upwards in byte order.
const std::array<char32_t, 256>& byte_chars() {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      t[static_cast<std::size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  return table;
}

const std::unordered_map<char32_t, uint8_t>& char_bytes() {
  static const std::unordered_map<char32_t, uint8_t> m = [] {
    std::unordered_map<char32_t, uint8_t> out;
    for (int b = 0; b < 256; ++b)
      out[byte_chars()[static_cast<std::size_t>(b)]] = static_cast<uint8_t>(b);
    return out;
  }();
  return m;
}

}  // namespace

SplitRegex::SplitRegex(const std::string& pattern, const std::string& where) : where_(where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                        PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code_ == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    TE_FAIL("tokenizer: ", where, ": the pattern does not compile at offset ", offset, ": ",
            reinterpret_cast<const char*>(message));
  }
}

SplitRegex::~SplitRegex() { pcre2_code_free(code(code_)); }

std::vector<std::string> SplitRegex::isolate(std::string_view text) const {
  std::vector<std::string> out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code(code_), nullptr);
  TE_CHECK(md != nullptr, "internal: PCRE2 could not allocate match data");
  const auto* s = reinterpret_cast<PCRE2_SPTR>(text.data());
  std::size_t at = 0, gap = 0;
  while (at <= text.size()) {
    // The subject is checked as UTF-8 once, by the first call; later calls start on character
    // boundaries of the same text.
    const int rc =
        pcre2_match(code(code_), s, text.size(), at, at == 0 ? 0 : PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      TE_FAIL("tokenizer: ", where_, ": matching failed (PCRE2 error ", rc, ")");
    }
    const PCRE2_SIZE* v = pcre2_get_ovector_pointer(md);
    const std::size_t begin = v[0], end = v[1];
    if (begin > gap) out.emplace_back(text.substr(gap, begin - gap));
    if (end > begin) {
      out.emplace_back(text.substr(begin, end - begin));
      gap = at = end;
    } else {
      // An empty match: step over one character.
      gap = begin;
      if (begin >= text.size()) break;
      std::size_t next = begin + 1;
      while (next < text.size() && (static_cast<unsigned char>(text[next]) & 0xC0) == 0x80) ++next;
      at = next;
    }
  }
  if (gap < text.size()) out.emplace_back(text.substr(gap));
  pcre2_match_data_free(md);
  return out;
}

const std::string& gpt2_pattern() {
  static const std::string p =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  return p;
}

std::string to_byte_level(std::string_view text) {
  std::string out;
  out.reserve(text.size() * 2);
  for (const char c : text) append_utf8(out, byte_chars()[static_cast<unsigned char>(c)]);
  return out;
}

std::string from_byte_level(std::string_view token) {
  std::string out;
  const auto* s = reinterpret_cast<const uint8_t*>(token.data());
  const auto n = static_cast<int32_t>(token.size());
  for (int32_t i = 0; i < n;) {
    UChar32 c = 0;
    U8_NEXT(s, i, n, c);
    const auto it = c < 0 ? char_bytes().end() : char_bytes().find(static_cast<char32_t>(c));
    if (it == char_bytes().end()) return std::string(token);  // not byte-level: as it is
    out += static_cast<char>(it->second);
  }
  return out;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  const auto* s = reinterpret_cast<const uint8_t*>(bytes.data());
  const auto n = static_cast<int32_t>(bytes.size());
  for (int32_t i = 0; i < n;) {
    const int32_t start = i;
    UChar32 c = 0;
    U8_NEXT(s, i, n, c);  // an invalid sequence: its maximal subpart, as Rust's from_utf8_lossy
    if (c < 0) {
      append_utf8(out, 0xFFFD);
    } else {
      out.append(
          bytes.substr(static_cast<std::size_t>(start), static_cast<std::size_t>(i - start)));
    }
  }
  return out;
}

Bpe::Bpe(const std::unordered_map<std::string, int64_t>& vocab,
         const std::vector<std::pair<std::string, std::string>>& merges, const BpeOptions& options,
         const std::string& where)
    : vocab_(vocab), options_(options), byte_ids_(256, -1) {
  for (int b = 0; b < 256 && options_.byte_fallback; ++b) {
    static const char kHex[] = "0123456789ABCDEF";
    const std::string name = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    const auto it = vocab.find(name);
    if (it != vocab.end()) byte_ids_[static_cast<std::size_t>(b)] = it->second;
  }
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    TE_CHECK(vocab.count(a + b) != 0, "tokenizer: ", where, ": merge ", r, " ('", a, "' '", b,
             "') makes '", a + b, "', which is not in the vocabulary");
    // A merge of a token the vocabulary lacks can never apply (every symbol is in it).
    const auto left = vocab.find(a), right = vocab.find(b);
    if (left == vocab.end() || right == vocab.end()) continue;
    merges_.emplace(Pair{left->second, right->second},
                    Merge{static_cast<int64_t>(r), vocab.at(a + b)});  // the first rank stays
  }
}

void Bpe::encode(std::string_view word, std::vector<int64_t>& out) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    const auto whole = vocab_.find(std::string(word));
    if (whole != vocab_.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  // The word's characters (UTF-8 pieces) that the vocabulary has, as a linked list of symbols.
  struct Symbol {
    int64_t id;
    int64_t prev, next;  // -1: none
    bool alive;
  };
  std::vector<Symbol> symbols;
  const auto* s = reinterpret_cast<const uint8_t*>(word.data());
  const auto n = static_cast<int32_t>(word.size());
  for (int32_t i = 0; i < n;) {
    const int32_t start = i;
    UChar32 c = 0;
    U8_NEXT(s, i, n, c);
    const std::string_view ch =
        word.substr(static_cast<std::size_t>(start), static_cast<std::size_t>(i - start));
    const auto add = [&](int64_t id) {
      const auto k = static_cast<int64_t>(symbols.size());
      symbols.push_back({id, k - 1, k + 1, true});
    };
    const auto it = vocab_.find(std::string(ch));
    if (it != vocab_.end()) {
      add(it->second);
      continue;
    }
    // word.rs merge_word: the character's bytes, else the unknown token (fused), else nothing.
    if (options_.byte_fallback && std::all_of(ch.begin(), ch.end(), [&](char c) {
          return byte_ids_[static_cast<uint8_t>(c)] >= 0;
        })) {
      for (const char c : ch) add(byte_ids_[static_cast<uint8_t>(c)]);
      continue;
    }
    if (!options_.unk) continue;
    if (options_.fuse_unk && !symbols.empty() && symbols.back().id == *options_.unk) continue;
    add(*options_.unk);
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  // Candidate merges, lowest rank first, then leftmost (tokenizers' word.rs merge_all): a
  // candidate whose symbols have changed since is skipped when it comes up.
  using Candidate = std::tuple<int64_t, int64_t, int64_t>;  // rank, position, id it makes
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto offer = [&](int64_t pos) {
    const int64_t next = symbols[static_cast<std::size_t>(pos)].next;
    if (next < 0) return;
    const auto it = merges_.find(Pair{symbols[static_cast<std::size_t>(pos)].id,
                                      symbols[static_cast<std::size_t>(next)].id});
    if (it != merges_.end()) queue.emplace(it->second.rank, pos, it->second.id);
  };
  for (int64_t i = 0; i < static_cast<int64_t>(symbols.size()); ++i) offer(i);
  while (!queue.empty()) {
    const auto [rank, pos, id] = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<std::size_t>(pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<std::size_t>(left.next)];
    const auto now = merges_.find(Pair{left.id, right.id});
    if (now == merges_.end() || now->second.id != id) continue;  // stale
    left.id = id;
    right.alive = false;
    left.next = right.next;
    if (left.next >= 0) symbols[static_cast<std::size_t>(left.next)].prev = pos;
    if (left.prev >= 0) offer(left.prev);
    offer(pos);
  }
  for (const Symbol& sym : symbols) {
    if (sym.alive) out.push_back(sym.id);
  }
}

}  // namespace te::hf::detail
