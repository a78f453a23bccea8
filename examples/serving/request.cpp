#include "request.h"

#include <nlohmann/json.hpp>

#include <cstdint>

#include "text.h"

namespace serve {

using json = nlohmann::json;

bool valid_utf8(std::string_view text) {
  std::size_t i = 0;
  const std::size_t n = text.size();
  while (i < n) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    int extra = 0;
    uint32_t cp = 0;
    if ((c & 0xE0) == 0xC0) {
      extra = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3;
      cp = c & 0x07;
    } else {
      return false;  // a continuation byte first, or 0xF8..0xFF
    }
    if (i + static_cast<std::size_t>(extra) >= n) return false;  // cut short
    for (int k = 1; k <= extra; ++k) {
      const auto d = static_cast<unsigned char>(text[i + static_cast<std::size_t>(k)]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += static_cast<std::size_t>(extra) + 1;
  }
  return true;
}

std::vector<std::string> decode_classify(std::string_view body, std::size_t max_sentences) {
  if (!valid_utf8(body)) throw HttpError(400, "the body is not valid UTF-8");
  json doc;
  try {
    doc = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number no double holds ("1e999": found by
    // fuzz/fuzz_request, it was answered 500 as a failed classification).
    throw HttpError(400, std::string("the body is not JSON: ") + e.what());
  }
  if (!doc.is_object()) {
    throw HttpError(400, "the body is a JSON " + std::string(doc.type_name()) +
                             "; send an object {\"sentences\": [\"...\"]}");
  }
  const auto it = doc.find("sentences");
  if (it == doc.end()) {
    throw HttpError(400, "the body has no \"sentences\"; send {\"sentences\": [\"...\"]}");
  }
  if (!it->is_array()) {
    throw HttpError(400, "\"sentences\" is a JSON " + std::string(it->type_name()) +
                             "; it must be a list of strings");
  }
  if (it->empty()) throw HttpError(400, "\"sentences\" is empty; send at least one sentence");
  if (it->size() > max_sentences) {
    throw HttpError(413, "\"sentences\" holds " + std::to_string(it->size()) +
                             " sentences; this server takes at most " +
                             std::to_string(max_sentences) + " per request: split it");
  }
  std::vector<std::string> out;
  out.reserve(it->size());
  for (std::size_t i = 0; i < it->size(); ++i) {
    const json& s = (*it)[i];
    const std::string where = "sentences[" + std::to_string(i) + "]";
    if (!s.is_string()) {
      throw HttpError(400, where + " is a JSON " + std::string(s.type_name()) +
                               "; every sentence must be a string");
    }
    std::string text = s.get<std::string>();
    // JSON escapes (\ud800) can spell what the raw bytes may not.
    if (!valid_utf8(text)) throw HttpError(400, where + " is not valid UTF-8");
    if (encoder::tokenize(text).empty()) throw HttpError(400, where + " has no words");
    out.push_back(std::move(text));
  }
  return out;
}

}  // namespace serve
