#include "request.h"

#include <nlohmann/json.hpp>

#include <algorithm>
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

namespace {

// The body as a JSON object (400 otherwise); `shape` is what a good body looks like.
json parse_object(std::string_view body, const char* shape) {
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
    throw HttpError(
        400, "the body is a JSON " + std::string(doc.type_name()) + "; send an object " + shape);
  }
  return doc;
}

// A list of non-empty UTF-8 strings `field` (its entries named field[i] in errors).
std::vector<std::string> strings(const json& list, const std::string& field, std::size_t max_count,
                                 const char* what) {
  if (list.empty()) throw HttpError(400, "\"" + field + "\" is empty; send at least one " + what);
  if (list.size() > max_count) {
    throw HttpError(413, "\"" + field + "\" holds " + std::to_string(list.size()) + " " + what +
                             "s; this server takes at most " + std::to_string(max_count) +
                             " per request: split it");
  }
  std::vector<std::string> out;
  out.reserve(list.size());
  for (std::size_t i = 0; i < list.size(); ++i) {
    const json& s = list[i];
    const std::string where = field + "[" + std::to_string(i) + "]";
    if (!s.is_string()) {
      throw HttpError(400, where + " is a JSON " + std::string(s.type_name()) + "; every " + what +
                               " must be a string");
    }
    std::string text = s.get<std::string>();
    // JSON escapes (\ud800) can spell what the raw bytes may not.
    if (!valid_utf8(text)) throw HttpError(400, where + " is not valid UTF-8");
    out.push_back(std::move(text));
  }
  return out;
}

}  // namespace

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

EmbeddingsRequest decode_embeddings(std::string_view body, std::size_t max_inputs,
                                    int64_t dimensions) {
  const json doc = parse_object(body, "{\"input\": \"...\"} or {\"input\": [\"...\"]}");
  EmbeddingsRequest r;
  for (const auto& [key, value] : doc.items()) {
    if (key == "input" || key == "model" || key == "encoding_format" || key == "dimensions" ||
        key == "user") {
      continue;
    }
    throw HttpError(400, "\"" + key +
                             "\" is not a field of an embeddings request (input, "
                             "model, encoding_format, dimensions, user)");
  }
  const auto input = doc.find("input");
  if (input == doc.end()) {
    throw HttpError(400, "the body has no \"input\"; send {\"input\": \"...\"} or a list");
  }
  if (input->is_string()) {
    r.input = strings(json::array({*input}), "input", max_inputs, "input");
  } else if (input->is_array()) {
    if (!input->empty() && !(*input)[0].is_string()) {
      throw HttpError(400, "\"input\" holds " + std::string((*input)[0].type_name()) +
                               "s; this server embeds text: send strings, not token ids");
    }
    r.input = strings(*input, "input", max_inputs, "input");
  } else {
    throw HttpError(400, "\"input\" is a JSON " + std::string(input->type_name()) +
                             "; send a string or a list of strings");
  }
  for (std::size_t i = 0; i < r.input.size(); ++i) {
    if (r.input[i].empty()) {
      throw HttpError(400, "input[" + std::to_string(i) + "] is empty; send text to embed");
    }
  }
  if (const auto f = doc.find("encoding_format"); f != doc.end() && !f->is_null()) {
    if (*f != "float" && *f != "base64") {
      throw HttpError(400, "\"encoding_format\" is " + f->dump() + "; use \"float\" or \"base64\"");
    }
    r.base64 = *f == "base64";
  }
  if (const auto d = doc.find("dimensions"); d != doc.end() && !d->is_null()) {
    if (!d->is_number_integer() || d->get<int64_t>() != dimensions) {
      throw HttpError(400, "\"dimensions\" is " + d->dump() + ": this model's embeddings have " +
                               std::to_string(dimensions) +
                               " dimensions and te-serve does not shorten them; leave it out");
    }
  }
  return r;
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

}  // namespace serve
