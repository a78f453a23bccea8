#include "request.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <sstream>

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

namespace {

// The field `key` of a completion request, or null when absent.
const json& field(const json& doc, const char* key) {
  static const json kNull;
  const auto it = doc.find(key);
  return it == doc.end() ? kNull : *it;
}

[[noreturn]] void bad_field(const std::string& key, const std::string& problem) {
  throw HttpError(400, "\"" + key + "\" " + problem, key);
}

std::optional<double> number_field(const json& doc, const char* key, double lo, double hi,
                                   bool lo_open = false) {
  const json& v = field(doc, key);
  if (v.is_null()) return std::nullopt;
  if (!v.is_number()) bad_field(key, "is a JSON " + std::string(v.type_name()) + "; send a number");
  const double d = v.get<double>();
  if (!(lo_open ? d > lo : d >= lo) || !(d <= hi)) {
    std::ostringstream range;
    range << (lo_open ? "(" : "[") << lo << ", " << hi << "]";
    bad_field(key, "is " + v.dump() + "; it must lie in " + range.str());
  }
  return d;
}

std::optional<int64_t> integer_field(const json& doc, const char* key, int64_t lo, int64_t hi) {
  const json& v = field(doc, key);
  if (v.is_null()) return std::nullopt;
  if (!v.is_number_integer()) {
    bad_field(key, "is a JSON " + std::string(v.type_name()) + "; send an integer");
  }
  // nlohmann holds every non-negative integer as unsigned: both bounds are checked either way.
  const bool outside = v.is_number_unsigned()
                           ? v.get<uint64_t>() > static_cast<uint64_t>(hi) ||
                                 (lo > 0 && v.get<uint64_t>() < static_cast<uint64_t>(lo))
                           : v.get<int64_t>() < lo || v.get<int64_t>() > hi;
  if (outside) {
    bad_field(key, "is " + v.dump() + "; it must lie in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "]");
  }
  return v.get<int64_t>();
}

std::optional<bool> bool_field(const json& doc, const char* key) {
  const json& v = field(doc, key);
  if (v.is_null()) return std::nullopt;
  if (!v.is_boolean())
    bad_field(key, "is a JSON " + std::string(v.type_name()) + "; send true or false");
  return v.get<bool>();
}

std::string utf8_string(const json& v, const std::string& where) {
  if (!v.is_string()) {
    bad_field(where, "is a JSON " + std::string(v.type_name()) + "; send a string");
  }
  std::string text = v.get<std::string>();
  if (!valid_utf8(text)) bad_field(where, "is not valid UTF-8");
  return text;
}

// A field OpenAI defines that te-serve does not implement: accepted only when it asks for
// nothing (`inert` says whether the value does).
void unsupported(const json& doc, const char* key, bool (*inert)(const json&),
                 const char* instead) {
  const json& v = field(doc, key);
  if (v.is_null() || inert(v)) return;
  throw HttpError(
      400,
      "\"" + std::string(key) + "\" is " + v.dump() + ": te-serve does not support it; " + instead,
      key);
}

std::string message_content(const json& content, const std::string& where) {
  if (content.is_string()) return utf8_string(content, where);
  if (!content.is_array()) {
    bad_field(where, "is a JSON " + std::string(content.type_name()) +
                         "; send a string or a list of {\"type\": \"text\", \"text\": ...} parts");
  }
  std::string text;
  for (std::size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!part.is_object() || field(part, "type") != "text") {
      bad_field(at,
                "is not a text part; te-serve's models read text only ({\"type\": \"text\", "
                "\"text\": ...})");
    }
    text += utf8_string(field(part, "text"), at + ".text");
  }
  return text;
}

}  // namespace

CompletionRequest decode_completion(std::string_view body, bool chat) {
  const json doc =
      parse_object(body, chat ? "{\"messages\": [{\"role\": \"user\", \"content\": \"...\"}]}"
                              : "{\"prompt\": \"...\"}");
  CompletionRequest r;
  r.chat = chat;
  if (chat) {
    const json& m = field(doc, "messages");
    if (m.is_null())
      bad_field("messages", "is missing; send [{\"role\": \"user\", \"content\": \"...\"}]");
    if (!m.is_array() || m.empty()) bad_field("messages", "must be a non-empty list of messages");
    for (std::size_t i = 0; i < m.size(); ++i) {
      const std::string where = "messages[" + std::to_string(i) + "]";
      if (!m[i].is_object())
        bad_field(where,
                  "is a JSON " + std::string(m[i].type_name()) + "; send {\"role\", \"content\"}");
      std::string role = utf8_string(field(m[i], "role"), where + ".role");
      if (role == "developer") role = "system";
      if (role != "system" && role != "user" && role != "assistant") {
        bad_field(where + ".role",
                  "is \"" + role + "\"; use system, user or assistant (te-serve has no tools)");
      }
      if (const json& calls = field(m[i], "tool_calls"); !calls.is_null() && !calls.empty()) {
        bad_field(where + ".tool_calls", "is not supported: te-serve has no tool calls");
      }
      r.messages.push_back({role, message_content(field(m[i], "content"), where + ".content")});
    }
  } else {
    const json& p = field(doc, "prompt");
    if (p.is_null()) bad_field("prompt", "is missing; send {\"prompt\": \"...\"}");
    if (p.is_string()) {
      r.prompt = utf8_string(p, "prompt");
    } else if (p.is_array() && !p.empty() && p[0].is_number_integer()) {
      for (std::size_t i = 0; i < p.size(); ++i) {
        if (!p[i].is_number_integer() || p[i].get<int64_t>() < 0) {
          bad_field("prompt[" + std::to_string(i) + "]",
                    "is " + p[i].dump() + "; a list of token ids holds non-negative integers");
        }
        r.prompt_ids.push_back(p[i].get<int64_t>());
      }
    } else if (p.is_array() && p.size() == 1) {
      r.prompt = utf8_string(p[0], "prompt[0]");
    } else {
      bad_field("prompt", p.is_array() ? "holds " + std::to_string(p.size()) +
                                             " prompts; te-serve takes one per request (n = 1)"
                                       : "is a JSON " + std::string(p.type_name()) +
                                             "; send a string or a list of token ids");
    }
    if (r.prompt.empty() && r.prompt_ids.empty())
      bad_field("prompt", "is empty; send text to continue");
  }
  if (const json& m = field(doc, "model"); !m.is_null()) r.model = utf8_string(m, "model");
  constexpr int64_t kMaxTokens = int64_t{1} << 30;
  r.max_tokens = integer_field(doc, "max_tokens", 1, kMaxTokens);
  if (chat) {
    if (auto m = integer_field(doc, "max_completion_tokens", 1, kMaxTokens)) {
      if (r.max_tokens && *r.max_tokens != *m) {
        bad_field("max_completion_tokens", "is " + std::to_string(*m) + " but \"max_tokens\" is " +
                                               std::to_string(*r.max_tokens) +
                                               "; send one of them");
      }
      r.max_tokens = m;
      r.max_tokens_field = "max_completion_tokens";
    }
  }
  r.temperature = number_field(doc, "temperature", 0, 2);
  r.top_p = number_field(doc, "top_p", 0, 1, /*lo_open=*/true);
  r.min_p = number_field(doc, "min_p", 0, 1);
  r.repetition_penalty = number_field(doc, "repetition_penalty", 0, 100, true);
  r.presence_penalty = number_field(doc, "presence_penalty", -2, 2);
  r.frequency_penalty = number_field(doc, "frequency_penalty", -2, 2);
  if (auto k = integer_field(doc, "top_k", -1, kMaxTokens)) r.top_k = std::max<int64_t>(0, *k);
  if (const json& s = field(doc, "seed"); !s.is_null()) {
    if (!s.is_number_integer())
      bad_field("seed", "is a JSON " + std::string(s.type_name()) + "; send an integer");
    r.seed = s.is_number_unsigned() ? s.get<uint64_t>() : static_cast<uint64_t>(s.get<int64_t>());
  }
  if (auto n = integer_field(doc, "n", 1, kMaxTokens); n && *n != 1) {
    bad_field("n", "is " + std::to_string(*n) +
                       "; te-serve returns one choice per request: send n copies of it");
  }
  if (const json& s = field(doc, "stop"); !s.is_null()) {
    const json list = s.is_string() ? json::array({s}) : s;
    if (!list.is_array())
      bad_field("stop",
                "is a JSON " + std::string(s.type_name()) + "; send a string or a list of them");
    if (list.size() > 4)
      bad_field("stop", "holds " + std::to_string(list.size()) + " strings; at most 4");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string where = s.is_string() ? "stop" : "stop[" + std::to_string(i) + "]";
      std::string text = utf8_string(list[i], where);
      if (text.empty()) bad_field(where, "is empty");
      r.stop.push_back(std::move(text));
    }
  }
  if (const json& ids = field(doc, "stop_token_ids"); !ids.is_null()) {
    if (!ids.is_array()) bad_field("stop_token_ids", "must be a list of token ids");
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (!ids[i].is_number_integer() || ids[i].get<int64_t>() < 0) {
        bad_field("stop_token_ids[" + std::to_string(i) + "]",
                  "is " + ids[i].dump() + "; send a token id");
      }
      r.stop_token_ids.push_back(ids[i].get<int64_t>());
    }
  }
  r.ignore_eos = bool_field(doc, "ignore_eos").value_or(false);
  r.stream = bool_field(doc, "stream").value_or(false);
  if (const json& o = field(doc, "stream_options"); !o.is_null()) {
    if (!o.is_object()) bad_field("stream_options", "must be an object");
    if (!r.stream) bad_field("stream_options", "is only allowed with \"stream\": true");
    r.include_usage = bool_field(o, "include_usage").value_or(false);
  }
  if (chat) {
    const bool logprobs = bool_field(doc, "logprobs").value_or(false);
    const auto top = integer_field(doc, "top_logprobs", 0, 20);
    if (top && !logprobs) bad_field("top_logprobs", "needs \"logprobs\": true");
    if (logprobs) r.logprobs = top.value_or(0);
  } else {
    if (auto n = integer_field(doc, "logprobs", 0, 5)) r.logprobs = *n;
  }
  auto is_one = [](const json& v) { return v.is_number_integer() && v.get<int64_t>() == 1; };
  auto is_false = [](const json& v) { return v.is_boolean() && !v.get<bool>(); };
  auto is_empty = [](const json& v) {
    return (v.is_object() || v.is_array() || v.is_string()) && v.empty();
  };
  unsupported(doc, "logit_bias", is_empty, "leave it out");
  // vLLM's extensions te-serve does not implement, refused when they would change the answer.
  auto is_true = [](const json& v) { return v.is_boolean() && v.get<bool>(); };
  auto is_null = [](const json& v) { return v.is_null(); };
  auto is_zero_int = [](const json& v) { return v.is_number_integer() && v.get<int64_t>() == 0; };
  unsupported(doc, "min_tokens", is_zero_int, "leave it out");
  unsupported(doc, "include_stop_str_in_output", is_false, "the stop string is never returned");
  unsupported(doc, "skip_special_tokens", is_true, "special tokens are left out of the text");
  unsupported(doc, "prompt_logprobs", is_null, "te-serve returns the generated tokens' only");
  for (const char* key :
       {"guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs"}) {
    unsupported(doc, key, is_null, "te-serve has no constrained decoding");
  }
  if (chat) {
    unsupported(doc, "add_generation_prompt", is_true, "the assistant's turn is always opened");
    unsupported(doc, "continue_final_message", is_false, "the assistant's turn is always opened");
    unsupported(doc, "echo", is_false, "the prompt is not returned with the text");
    unsupported(
        doc, "tool_choice",
        [](const json& v) { return v.is_string() && v.get<std::string>() == "none"; },
        "te-serve has no tool calls");
    unsupported(doc, "tools", is_empty, "te-serve has no tool calls");
    unsupported(doc, "functions", is_empty, "te-serve has no tool calls");
    unsupported(
        doc, "response_format",
        [](const json& v) { return v.is_object() && field(v, "type") == "text"; },
        "only {\"type\": \"text\"}");
  } else {
    unsupported(doc, "echo", is_false, "the prompt is not returned with the text");
    unsupported(doc, "suffix", is_empty, "te-serve has no insertion mode");
    unsupported(doc, "best_of", is_one, "te-serve returns one choice per request");
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
