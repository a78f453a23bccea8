#pragma once

// What ranks send one another (te-serve's commands from rank 0, the Engine's token events between
// data-parallel groups), in one encoding. Each message type declares its fields once, as
// Fields<T>: (name, member) pairs. to_bytes/from_bytes write and read them by name as CBOR
// (nlohmann::json); a Fields<T> that misses one of T's members does not compile (its length is
// checked against T's member count), and bytes that lack a field, or hold another type there, are
// refused with the field's path.
// Needs nlohmann_json's header (Debian's nlohmann-json3-dev; link nlohmann_json::nlohmann_json).
//
// Example (a message type of one's own):
//   struct Ping { int64_t id = 0; std::string text; };
//   template <> struct te::gen::wire::Fields<Ping> {
//     static auto list() { return std::make_tuple(field("id", &Ping::id),
//                                                 field("text", &Ping::text)); }
//   };
//   Ping back = te::gen::wire::from_bytes<Ping>(te::gen::wire::to_bytes(Ping{7, "hi"}));

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "te/error.h"
#include "te/gen/generate.h"

namespace te::gen::wire {

template <class T, class M>
struct Field {
  const char* name;
  M T::*member;
};
template <class T, class M>
constexpr Field<T, M> field(const char* name, M T::*member) {
  return {name, member};
}

/// Specialise with `static auto list()` returning a tuple of field(...)s, every member of T.
template <class T>
struct Fields;

namespace detail {

// T's member count, as the longest brace initialiser T accepts (T an aggregate).
struct AnyField {
  template <class U>
  operator U() const;
};
template <class T, class... A>
constexpr auto braces(int) -> decltype(T{std::declval<A>()...}, true) {
  return true;
}
template <class T, class... A>
constexpr bool braces(long) {
  return false;
}
template <class T, class... A>
constexpr std::size_t member_count() {
  if constexpr (sizeof...(A) < 64 && braces<T, A..., AnyField>(0)) {
    return member_count<T, A..., AnyField>();
  } else {
    return sizeof...(A);
  }
}

template <class T, class = void>
struct has_fields : std::false_type {};
template <class T>
struct has_fields<T, std::void_t<decltype(Fields<T>::list())>> : std::true_type {};

template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class T>
struct is_pair : std::false_type {};
template <class A, class B>
struct is_pair<std::pair<A, B>> : std::true_type {};

}  // namespace detail

template <class T>
nlohmann::json encode(const T& value) {
  if constexpr (detail::has_fields<T>::value) {
    static_assert(std::tuple_size_v<decltype(Fields<T>::list())> == detail::member_count<T>(),
                  "te::gen::wire::Fields<T> must list every member of T");
    nlohmann::json out = nlohmann::json::object();
    std::apply([&](const auto&... f) { ((out[f.name] = encode(value.*(f.member))), ...); },
               Fields<T>::list());
    return out;
  } else if constexpr (detail::is_vector<T>::value) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& item : value) out.push_back(encode(item));
    return out;
  } else if constexpr (detail::is_pair<T>::value) {
    return nlohmann::json::array({encode(value.first), encode(value.second)});
  } else {
    static_assert(std::is_arithmetic_v<T> || std::is_same_v<T, std::string>,
                  "te::gen::wire: give this type a Fields<T>");
    return nlohmann::json(value);
  }
}

template <class T>
void decode(const nlohmann::json& j, T& value, const std::string& path) {
  if constexpr (detail::has_fields<T>::value) {
    TE_CHECK(j.is_object(), "wire: ", path, " is not an object");
    auto one = [&](const auto& f) {
      TE_CHECK(j.contains(f.name), "wire: ", path, ".", f.name,
               " is missing (do the ranks run different te-cpp builds?)");
      decode(j.at(f.name), value.*(f.member), path + "." + f.name);
    };
    std::apply([&](const auto&... f) { (one(f), ...); }, Fields<T>::list());
  } else if constexpr (detail::is_vector<T>::value) {
    TE_CHECK(j.is_array(), "wire: ", path, " is not an array");
    value.resize(j.size());
    for (std::size_t i = 0; i < j.size(); ++i) {
      decode(j[i], value[i], path + "[" + std::to_string(i) + "]");
    }
  } else if constexpr (detail::is_pair<T>::value) {
    TE_CHECK(j.is_array() && j.size() == 2, "wire: ", path, " is not a pair");
    decode(j[0], value.first, path + "[0]");
    decode(j[1], value.second, path + "[1]");
  } else {
    const bool fits = std::is_same_v<T, std::string>   ? j.is_string()
                      : std::is_same_v<T, bool>        ? j.is_boolean()
                      : std::is_floating_point_v<T>    ? j.is_number()
                                                       : j.is_number_integer();
    TE_CHECK(fits, "wire: ", path, " holds ", j.type_name(), ", not the field's type");
    value = j.get<T>();
  }
}

/// `value` as CBOR.
template <class T>
std::string to_bytes(const T& value) {
  const std::vector<std::uint8_t> cbor = nlohmann::json::to_cbor(encode(value));
  return std::string(cbor.begin(), cbor.end());
}

/// What to_bytes wrote; te::Error naming the first field that is missing or of another type.
template <class T>
T from_bytes(const std::string& bytes, const std::string& what = "message") {
  nlohmann::json j;
  try {
    j = nlohmann::json::from_cbor(bytes);
  } catch (const nlohmann::json::exception& e) {
    TE_FAIL("wire: ", what, " is not CBOR (", bytes.size(), " bytes): ", e.what());
  }
  T value{};
  decode(j, value, what);
  return value;
}

// ---- te::gen's messages ----------------------------------------------------------------------

template <>
struct Fields<SamplingOptions> {
  static auto list() {
    using S = SamplingOptions;
    return std::make_tuple(field("temperature", &S::temperature), field("top_k", &S::top_k),
                           field("top_p", &S::top_p), field("min_p", &S::min_p),
                           field("repetition_penalty", &S::repetition_penalty),
                           field("presence_penalty", &S::presence_penalty),
                           field("frequency_penalty", &S::frequency_penalty),
                           field("seed", &S::seed));
  }
};

template <>
struct Fields<GenerateOptions> {
  static auto list() {
    using G = GenerateOptions;
    return std::make_tuple(field("max_tokens", &G::max_tokens), field("sampling", &G::sampling),
                           field("stop_token_ids", &G::stop_token_ids),
                           field("top_logprobs", &G::top_logprobs), field("stop", &G::stop));
  }
};

template <>
struct Fields<TokenEvent> {
  static auto list() {
    using E = TokenEvent;
    return std::make_tuple(field("request", &E::request), field("token", &E::token),
                           field("logprob", &E::logprob), field("top_logprobs", &E::top_logprobs),
                           field("finish_reason", &E::finish_reason), field("text", &E::text));
  }
};

template <>
struct Fields<EngineStats> {
  static auto list() {
    using S = EngineStats;
    return std::make_tuple(field("running", &S::running), field("waiting", &S::waiting),
                           field("blocks_used", &S::blocks_used),
                           field("blocks_free", &S::blocks_free),
                           field("preemptions", &S::preemptions), field("steps", &S::steps),
                           field("prefill_tokens", &S::prefill_tokens),
                           field("decode_tokens", &S::decode_tokens));
  }
};

}  // namespace te::gen::wire
