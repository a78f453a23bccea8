#pragma once

// The one error type of te-cpp and the one check macro every layer uses.
//
// A message names the culprit (the axis, the dim, the mesh axis, the rank) and says what to do;
// the macro appends the source location so a report can be traced without a debugger.

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace te {

/// Thrown for every misuse of the library: bad rules, bad axes, bad meshes, failed collectives.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// How a shape reads in a message: "[4, 6]", as LibTorch prints sizes.
std::string shape_text(const std::vector<int64_t>& shape);

namespace detail {

/// Keeps the last two path components ("sharding/rules.cpp") so messages stay short but unique.
const char* short_source_path(const char* file) noexcept;

template <typename... Args>
[[noreturn]] void throw_error(const char* file, int line, const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  os << " [" << short_source_path(file) << ':' << line << ']';
  throw Error(os.str());
}

}  // namespace detail
}  // namespace te

/// TE_CHECK(cond, "what went wrong with ", culprit, "; what to do") throws te::Error when `cond`
/// is false. The message parts are streamed, so any printable value may be passed.
#define TE_CHECK(cond, ...)                                       \
  do {                                                            \
    if (!(cond)) {                                                \
      ::te::detail::throw_error(__FILE__, __LINE__, __VA_ARGS__); \
    }                                                             \
  } while (false)

/// Unconditional form of TE_CHECK for branches that are errors by construction.
#define TE_FAIL(...) ::te::detail::throw_error(__FILE__, __LINE__, __VA_ARGS__)
