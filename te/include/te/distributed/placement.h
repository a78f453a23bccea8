#pragma once

// Per-mesh-dim layouts of a distributed tensor (DTensor-like) and torch.chunk's split arithmetic.

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

namespace te {

/// How the values of a Partial tensor combine across a mesh dim.
enum class ReduceOp { kSum, kAvg, kMax, kMin };

/// The tensor dim `dim` is split over the mesh dim (torch.chunk sizes: ceil(n / k) each, the
/// trailing ranks possibly short or empty).
struct Shard {
  int64_t dim = 0;
};
/// Every rank along the mesh dim holds the whole tensor.
struct Replicate {};
/// Every rank holds a full-shaped tensor; the true value is their reduction by `op`. Arises from
/// computation (a local matmul over a sharded contraction dim), never from redistribute.
struct Partial {
  ReduceOp op = ReduceOp::kSum;
};

using Placement = std::variant<Shard, Replicate, Partial>;

inline bool operator==(const Shard& a, const Shard& b) { return a.dim == b.dim; }
inline bool operator==(const Replicate&, const Replicate&) { return true; }
inline bool operator==(const Partial& a, const Partial& b) { return a.op == b.op; }
inline bool operator!=(const Shard& a, const Shard& b) { return !(a == b); }
inline bool operator!=(const Replicate&, const Replicate&) { return false; }
inline bool operator!=(const Partial& a, const Partial& b) { return !(a == b); }

inline bool is_shard(const Placement& p) { return std::holds_alternative<Shard>(p); }
inline bool is_shard(const Placement& p, int64_t dim) {
  return is_shard(p) && std::get<Shard>(p).dim == dim;
}
inline bool is_replicate(const Placement& p) { return std::holds_alternative<Replicate>(p); }
inline bool is_partial(const Placement& p) { return std::holds_alternative<Partial>(p); }

std::string to_string(ReduceOp op);                        ///< "sum", "avg", "max", "min"
std::string to_string(const Placement& p);                 ///< "Shard(0)", "Replicate()", "Partial(sum)"
std::string to_string(const std::vector<Placement>& ps);  ///< "[Shard(0), Replicate()]"

/// One part of a dim split into `parts` with torch.chunk's rule.
struct Chunk {
  int64_t offset = 0;
  int64_t length = 0;
};
/// Part `index` of a dim of `size` split into `parts`: 5 over 4 gives lengths 2, 2, 1, 0.
Chunk chunk_of(int64_t size, int64_t parts, int64_t index);

}  // namespace te
