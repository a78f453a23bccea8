#include "json_body.h"

#include <sstream>

#include "te/serve/request.h"

namespace te::serve::detail {

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

// The field `key` of an object, or null when absent.
const json& field(const json& doc, const char* key) {
  static const json kNull;
  const auto it = doc.find(key);
  return it == doc.end() ? kNull : *it;
}

[[noreturn]] void bad_field(const std::string& key, const std::string& problem) {
  throw HttpError(400, "\"" + key + "\" " + problem, key);
}

std::optional<double> number_field(const json& doc, const char* key, double lo, double hi,
                                   bool lo_open) {
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

}  // namespace te::serve::detail
