#pragma once

// A mesh as a command line gives it, before any rank exists: its axis names and sizes.

#include <cstdint>
#include <optional>
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
  /// The size of axis `name`, or nullopt where the mesh has no such axis.
  std::optional<int64_t> size_of(std::string_view name) const;

  friend bool operator==(const MeshShape& a, const MeshShape& b) {
    return a.sizes == b.sizes && a.names == b.names;
  }
  friend bool operator!=(const MeshShape& a, const MeshShape& b) { return !(a == b); }
};

/// Reads "NAME=SIZE[,NAME=SIZE...]" (e.g. "data=2,model=2"): te::Error naming the item for one
/// that is not NAME=SIZE, a size that is not a positive integer, a name given twice, or nothing.
MeshShape parse_mesh_shape(std::string_view text);

}  // namespace te
