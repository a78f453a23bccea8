// te::Error's support: the short source path its messages end with, and how a shape reads. The core
// target every layer links (docs/ARCHITECTURE.md §1).

#include <cstring>

#include "te/error.h"

namespace te {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

namespace detail {

const char* short_source_path(const char* file) noexcept {
  const char* last = std::strrchr(file, '/');
  if (last == nullptr) return file;
  for (const char* p = last - 1; p >= file; --p) {
    if (*p == '/') return p + 1;
  }
  return file;
}

}  // namespace detail
}  // namespace te
