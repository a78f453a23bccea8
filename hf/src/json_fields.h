#pragma once

// Reading a Hugging Face config.json strictly: each field read is remembered, and every field
// neither read nor known metadata is a te::Error naming it (used by every family's parser).

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "te/error.h"

namespace te::hf::detail {

using nlohmann::json;

// Fields that cannot change a forward pass: token ids, generation and bookkeeping metadata.
inline const std::set<std::string> kMetadata = {
    "_name_or_path",        "architectures",
    "bos_token_id",         "eos_token_id",
    "pad_token_id",         "initializer_range",
    "transformers_version", "use_cache",
    "torch_dtype",          "dtype",
    "model_type",           "keys_to_ignore_at_inference",
    "output_attentions",    "output_hidden_states",
    "return_dict",
};

// Reads fields of one JSON object, remembering which it read; the rest must be metadata.
class Fields {
 public:
  /// `kind` starts each message ("config", "tokenizer"); `what` prefixes each field's name.
  Fields(const json& j, std::string path, std::string what, std::string kind = "config")
      : j_(j), path_(std::move(path)), what_(std::move(what)), kind_(std::move(kind)) {}

  const std::string& path() const { return path_; }
  [[noreturn]] void fail(const std::string& field, const std::string& message) const {
    TE_FAIL(kind_, ": '", path_, "': ", what_, field, ": ", message);
  }
  bool has(const std::string& key) {
    read_.insert(key);
    return j_.contains(key) && !j_.at(key).is_null();
  }
  /// Whether the object holds `key`, null or not (not remembered as read).
  bool contains(const std::string& key) const { return j_.contains(key); }
  int64_t integer(const std::string& key) {
    TE_CHECK(has(key), kind_, ": '", path_, "': ", what_, key, " is missing; a ", kind_,
             " of this kind needs it");
    return integer_at(key);
  }
  int64_t integer_or(const std::string& key, int64_t fallback) {
    return has(key) ? integer_at(key) : fallback;
  }
  double number_or(const std::string& key, double fallback) {
    if (!has(key)) return fallback;
    if (!j_.at(key).is_number()) fail(key, "expected a number, got " + j_.at(key).dump());
    return j_.at(key).get<double>();
  }
  bool boolean_or(const std::string& key, bool fallback) {
    if (!has(key)) return fallback;
    if (!j_.at(key).is_boolean()) fail(key, "expected true or false, got " + j_.at(key).dump());
    return j_.at(key).get<bool>();
  }
  std::string string_or(const std::string& key, const std::string& fallback) {
    if (!has(key)) return fallback;
    if (!j_.at(key).is_string()) fail(key, "expected a string, got " + j_.at(key).dump());
    return j_.at(key).get<std::string>();
  }
  const json& raw(const std::string& key) {
    read_.insert(key);
    return j_.at(key);
  }
  /// Every field neither read nor metadata is a te::Error naming it.
  void refuse_unread(const std::set<std::string>& metadata) const {
    for (const auto& [key, value] : j_.items()) {
      if (read_.count(key) || metadata.count(key)) continue;
      fail(key, "is not a field te-cpp honours (value " + value.dump() +
                    "); te-cpp builds the model from every field it reads and will not ignore "
                    "one that may change it");
    }
  }

 private:
  int64_t integer_at(const std::string& key) const {
    const json& v = j_.at(key);
    if (!v.is_number_integer()) fail(key, "expected an integer, got " + v.dump());
    return v.get<int64_t>();
  }
  const json& j_;
  std::string path_, what_, kind_;
  std::set<std::string> read_;
};

/// Parses `text` as a JSON object (`path` names it in errors).
inline nlohmann::json parse_json_object(std::string_view text, const std::string& path,
                                        const char* kind = "config") {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    TE_FAIL(kind, ": '", path, "' is not JSON: ", e.what());
  }
  TE_CHECK(j.is_object(), kind, ": '", path, "' is not a JSON object");
  return j;
}

/// Each model size (field, value) positive and at most 2^24 (a bound before anything is sized by
/// it: a hostile config cannot make te-cpp allocate), the layers at most 65536; te::Error
/// "config: <where>: <field>: ..." otherwise.
inline void check_model_sizes(const std::vector<std::pair<const char*, int64_t>>& sizes,
                              int64_t layers, const std::string& where) {
  constexpr int64_t kMaxSize = int64_t{1} << 24;
  for (const auto& [key, v] : sizes) {
    TE_CHECK(v > 0, "config: ", where, ": ", key, ": must be positive, got ", v);
    TE_CHECK(v <= kMaxSize, "config: ", where, ": ", key, ": ", v,
             " is more than te-cpp builds (2^24)");
  }
  TE_CHECK(layers <= 65536, "config: ", where, ": num_hidden_layers: ", layers,
           " is more than te-cpp builds (at most 65536)");
}

/// The text of `dir`/config.json (or of `dir` itself when it names a file), and its path.
std::pair<std::string, std::string> read_config_text(const std::string& dir);

}  // namespace te::hf::detail
