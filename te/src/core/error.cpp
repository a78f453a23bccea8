// te::Error's support: the short source path its messages end with. The core target every layer
// links (docs/ARCHITECTURE.md §1).

#include <cstring>

#include "te/error.h"

namespace te::detail {

const char* short_source_path(const char* file) noexcept {
  const char* last = std::strrchr(file, '/');
  if (last == nullptr) return file;
  for (const char* p = last - 1; p >= file; --p) {
    if (*p == '/') return p + 1;
  }
  return file;
}

}  // namespace te::detail
