// The SentencePiece-style steps of a tokenizer.json (Llama 2's, Mistral's and what te builds from
// a GGUF SentencePiece vocabulary): the Prepend and Replace normalizers, and the Replace,
// ByteFallback, Fuse and Strip decoders, read strictly and run as tokenizers 0.23.3 runs them
// (normalizers/prepend.rs, replace.rs; decoders/replace.rs, byte_fallback.rs, fuse.rs, strip.rs).

#include <nlohmann/json.hpp>

#include "json_fields.h"
#include "tokenizer_impl.h"
#include "unicode.h"

namespace te::hf::detail {

namespace {

// A Replace step's pattern and content (only a String pattern: a Regex one is refused).
void read_replace(Fields& f, const std::string& what, std::string& from, std::string& to) {
  if (!f.has("pattern") || !f.raw("pattern").is_object()) f.fail("pattern", "expected an object");
  Fields pattern(f.raw("pattern"), f.path(), what + "pattern.", "tokenizer");
  if (!pattern.has("String")) {
    pattern.fail("String", "is missing; te-cpp implements Replace with a String pattern only");
  }
  from = pattern.string_or("String", "");
  pattern.refuse_unread({});
  if (from.empty()) f.fail("pattern", "is empty");
  to = f.string_or("content", "");
}

}  // namespace

void read_text_edits(std::vector<TextEdit>& out, const nlohmann::json& n, const std::string& path,
                     const std::string& what) {
  Fields f(n, path, what, "tokenizer");
  const std::string type = f.string_or("type", "");
  if (type == "Sequence") {
    if (!f.has("normalizers") || !f.raw("normalizers").is_array()) {
      f.fail("normalizers", "expected a list");
    }
    const nlohmann::json& list = f.raw("normalizers");
    for (std::size_t i = 0; i < list.size(); ++i) {
      read_text_edits(out, list[i], path, what + "normalizers[" + std::to_string(i) + "].");
    }
  } else if (type == "Prepend") {
    TextEdit e;
    e.prepend = true;
    e.to = f.string_or("prepend", "");
    out.push_back(e);
  } else if (type == "Replace") {
    TextEdit e;
    read_replace(f, what, e.from, e.to);
    out.push_back(e);
  } else {
    f.fail("type", "'" + type +
                       "' is not a normalizer te-cpp implements (BertNormalizer; Prepend, Replace "
                       "and a Sequence of those)");
  }
  f.refuse_unread({});
}

void read_decode_steps(std::vector<DecodeStep>& out, const nlohmann::json& d,
                       const std::string& path, const std::string& what) {
  Fields f(d, path, what, "tokenizer");
  const std::string type = f.string_or("type", "");
  DecodeStep s;
  if (type == "Sequence") {
    if (!f.has("decoders") || !f.raw("decoders").is_array()) f.fail("decoders", "expected a list");
    const nlohmann::json& list = f.raw("decoders");
    for (std::size_t i = 0; i < list.size(); ++i) {
      read_decode_steps(out, list[i], path, what + "decoders[" + std::to_string(i) + "].");
    }
    f.refuse_unread({});
    return;
  }
  if (type == "Replace") {
    s.kind = DecodeStep::Kind::kReplace;
    read_replace(f, what, s.from, s.to);
  } else if (type == "ByteFallback") {
    s.kind = DecodeStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    s.kind = DecodeStep::Kind::kFuse;
  } else if (type == "Strip") {
    s.kind = DecodeStep::Kind::kStrip;
    s.content = f.string_or("content", " ");
    if (utf8_to_code_points(s.content, "tokenizer: Strip content").size() != 1) {
      f.fail("content", "'" + s.content + "' is not one character");
    }
    s.start = f.integer_or("start", 0);
    s.stop = f.integer_or("stop", 0);
    if (s.start < 0 || s.stop < 0) f.fail("start", "start and stop must be >= 0");
  } else {
    f.fail("type", "'" + type +
                       "' is not a decoder te-cpp implements (WordPiece, ByteLevel; Replace, "
                       "ByteFallback, Fuse, Strip and a Sequence of those)");
  }
  f.refuse_unread({});
  out.push_back(s);
}

std::string apply_edits(const std::vector<TextEdit>& edits, std::string text) {
  for (const TextEdit& e : edits) {
    if (e.prepend) {
      if (!text.empty()) text.insert(0, e.to);
      continue;
    }
    std::string out;
    std::size_t from = 0;
    for (std::size_t at = text.find(e.from); at != std::string::npos;
         at = text.find(e.from, from)) {
      out.append(text, from, at - from).append(e.to);
      from = at + e.from.size();
    }
    text = out.append(text, from, std::string::npos);
  }
  return text;
}

namespace {

// "<0x41>" -> 0x41 (byte_fallback.rs: six characters, two hex digits); -1 for any other token.
int byte_token(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (std::size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    const int digit = c >= '0' && c <= '9'   ? c - '0'
                      : c >= 'A' && c <= 'F' ? c - 'A' + 10
                      : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                             : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

// ByteFallback: each run of byte tokens becomes the text its bytes spell, or U+FFFD per byte
// when they are not valid UTF-8.
std::vector<std::string> byte_fallback(const std::vector<std::string>& tokens) {
  std::vector<std::string> out;
  std::string bytes;
  std::size_t count = 0;
  auto flush = [&] {
    if (count == 0) return;
    const std::string text = utf8_lossy(bytes);
    if (text == bytes) {
      out.push_back(text);
    } else {
      for (std::size_t i = 0; i < count; ++i) out.emplace_back("\xEF\xBF\xBD");
    }
    bytes.clear();
    count = 0;
  };
  for (const std::string& token : tokens) {
    const int b = byte_token(token);
    if (b < 0) {
      flush();
      out.push_back(token);
      continue;
    }
    bytes.push_back(static_cast<char>(b));
    ++count;
  }
  flush();
  return out;
}

// Strip: at most `start` leading and `stop` trailing `content` characters of each token.
std::string strip(const std::string& token, const DecodeStep& s) {
  std::size_t begin = 0, end = token.size();
  const std::size_t n = s.content.size();
  for (int64_t i = 0; i < s.start && end - begin >= n && token.compare(begin, n, s.content) == 0;
       ++i) {
    begin += n;
  }
  for (int64_t i = 0; i < s.stop && end - begin >= n && token.compare(end - n, n, s.content) == 0;
       ++i) {
    end -= n;
  }
  return token.substr(begin, end - begin);
}

}  // namespace

std::string run_decode_steps(const std::vector<DecodeStep>& steps,
                             std::vector<std::string> tokens) {
  for (const DecodeStep& s : steps) {
    switch (s.kind) {
      case DecodeStep::Kind::kReplace:
        for (std::string& t : tokens) t = apply_edits({{false, s.from, s.to}}, std::move(t));
        break;
      case DecodeStep::Kind::kByteFallback:
        tokens = byte_fallback(tokens);
        break;
      case DecodeStep::Kind::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens = {all};
        break;
      }
      case DecodeStep::Kind::kStrip:
        for (std::string& t : tokens) t = strip(t, s);
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace te::hf::detail
