#pragma once

// A mesh as a command line gives it, before any rank exists: its axis names and sizes.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace te {

struct MeshShape {
  std::vector<int64_t> sizes;
  std::vector<std::string> names;
  /// The number of ranks (the product of the sizes; 1 for no axes).
  int64_t size() const;
  /// "data=2,model=2", as parse_mesh_shape reads it.
  std::string to_string() const;
};

/// Reads "NAME=SIZE[,NAME=SIZE...]" (e.g. "data=2,model=2"): te::Error naming the item for one
/// that is not NAME=SIZE, a size that is not a positive integer, a name given twice, or nothing.
MeshShape parse_mesh_shape(std::string_view text);

}  // namespace te
