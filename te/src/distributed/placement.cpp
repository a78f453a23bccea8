#include "te/distributed/placement.h"

#include <algorithm>

#include "te/error.h"

namespace te {

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "?";
}

std::string to_string(const Placement& p) {
  if (const auto* s = std::get_if<Shard>(&p)) return "Shard(" + std::to_string(s->dim) + ")";
  if (const auto* q = std::get_if<Partial>(&p)) return "Partial(" + to_string(q->op) + ")";
  return "Replicate()";
}

std::string to_string(const std::vector<Placement>& ps) {
  std::string out = "[";
  for (std::size_t i = 0; i < ps.size(); ++i) out += (i ? ", " : "") + to_string(ps[i]);
  return out + "]";
}

Chunk chunk_of(int64_t size, int64_t parts, int64_t index) {
  TE_CHECK(size >= 0 && parts >= 1 && index >= 0 && index < parts, "chunk_of(size=", size,
           ", parts=", parts, ", index=", index, "): needs size >= 0 and 0 <= index < parts");
  const int64_t step = (size + parts - 1) / parts;
  const int64_t begin = std::min(size, index * step);
  const int64_t end = std::min(size, (index + 1) * step);
  return Chunk{begin, end - begin};
}

}  // namespace te
