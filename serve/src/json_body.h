#pragma once

// Reading a request body's JSON (te-serve's own routes and OpenAI's): each problem an HttpError
// 400 (413 for too many items) naming the field, so that every route words them alike.

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace te::serve::detail {

using json = nlohmann::json;

/// The body as a JSON object (400 otherwise: not UTF-8, not JSON, not an object); `shape` is what
/// a good body looks like, for the message.
json parse_object(std::string_view body, const char* shape);
/// A list of non-empty UTF-8 strings `field` (its entries named field[i] in errors); 413 for more
/// than `max_count`; `what` names one entry ("sentence", "input").
std::vector<std::string> strings(const json& list, const std::string& field, std::size_t max_count,
                                 const char* what);
/// The field `key` of an object, or null when absent.
const json& field(const json& doc, const char* key);
/// HttpError 400 "\"key\" problem" with `key` as its param.
[[noreturn]] void bad_field(const std::string& key, const std::string& problem);
/// The fields when present, checked for type and range (lo_open: lo itself excluded).
std::optional<double> number_field(const json& doc, const char* key, double lo, double hi,
                                   bool lo_open = false);
std::optional<int64_t> integer_field(const json& doc, const char* key, int64_t lo, int64_t hi);
std::optional<bool> bool_field(const json& doc, const char* key);
/// `v` as a string, which must be valid UTF-8; `where` names it in errors.
std::string utf8_string(const json& v, const std::string& where);

}  // namespace te::serve::detail
