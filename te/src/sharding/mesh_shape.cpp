#include "te/sharding/mesh_shape.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include "te/error.h"

namespace te {

int64_t MeshShape::size() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

std::string MeshShape::to_string() const {
  std::string out;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    out += (i ? "," : "") + names[i] + "=" + std::to_string(sizes[i]);
  }
  return out;
}

std::optional<int64_t> MeshShape::size_of(std::string_view name) const {
  const auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end()) return std::nullopt;
  return sizes[static_cast<std::size_t>(it - names.begin())];
}

MeshShape parse_mesh_shape(std::string_view text_in) {
  const std::string text(text_in);
  TE_CHECK(!text.empty(), "mesh is empty; give NAME=SIZE per axis, e.g. data=2,model=2");
  MeshShape mesh;
  int64_t ranks = 1;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    start = comma + 1;
    const auto eq = item.find('=');
    TE_CHECK(eq != std::string::npos && eq != 0, "mesh '", text, "': '", item,
             "' is not NAME=SIZE (e.g. data=2,model=2)");
    const std::string name = item.substr(0, eq), size = item.substr(eq + 1);
    char* end = nullptr;
    errno = 0;
    const long long value = std::strtoll(size.c_str(), &end, 10);
    TE_CHECK(!size.empty() && *end == '\0' && errno == 0 && value >= 1 && value <= (1 << 24),
             "mesh '", text, "': size '", size, "' of axis '", name,
             "' is not a positive integer (at most 2^24)");
    TE_CHECK(std::find(mesh.names.begin(), mesh.names.end(), name) == mesh.names.end(), "mesh '",
             text, "': axis '", name, "' appears twice");
    ranks *= value;
    TE_CHECK(ranks <= (int64_t{1} << 24), "mesh '", text, "' has over 2^24 ranks");
    mesh.names.push_back(name);
    mesh.sizes.push_back(value);
  }
  return mesh;
}

}  // namespace te
