#include "te/serve/request.h"

#include <algorithm>
#include <cstdint>

#include "json_body.h"
#include "te/encoder/text.h"

namespace te::serve {

using namespace detail;  // json_body.h

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
  const json doc = parse_object(body, "{\"sentences\": [\"...\"]}");
  const auto it = doc.find("sentences");
  if (it == doc.end()) {
    throw HttpError(400, "the body has no \"sentences\"; send {\"sentences\": [\"...\"]}");
  }
  if (!it->is_array()) {
    throw HttpError(400, "\"sentences\" is a JSON " + std::string(it->type_name()) +
                             "; it must be a list of strings");
  }
  std::vector<std::string> out = strings(*it, "sentences", max_sentences, "sentence");
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (encoder::tokenize(out[i]).empty()) {
      throw HttpError(400, "sentences[" + std::to_string(i) + "] has no words");
    }
  }
  return out;
}

std::string base64_encode(std::string_view bytes) {
  static const char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    const std::size_t n = std::min<std::size_t>(3, bytes.size() - i);
    uint32_t v = 0;
    for (std::size_t k = 0; k < 3; ++k) {
      v = (v << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    }
    for (std::size_t k = 0; k < 4; ++k) {
      out += k <= n ? kAlphabet[(v >> (18 - 6 * k)) & 63] : '=';
    }
  }
  return out;
}

}  // namespace te::serve
