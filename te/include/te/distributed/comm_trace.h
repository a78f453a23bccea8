#pragma once

// Records the collectives this thread runs: per kind and mesh axis, how many and how many bytes.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace te {

namespace detail {
struct ThreadScopes;
}

enum class Collective { kAllGather, kAllReduce, kReduceScatter, kAllToAll, kSendRecv };
std::string to_string(Collective kind);  ///< "all_gather", "all_reduce", ..., "send_recv"

struct CommRecord {
  Collective kind;
  std::string mesh_axis;
  /// The logical payload: all_gather, the gathered (full) tensor; all_reduce, the reduced tensor;
  /// reduce_scatter, the full input; all_to_all, this rank's local input; send_recv (a ring
  /// step of context parallelism), what this rank sent.
  int64_t bytes = 0;
  /// The call that carried it ("allreduce", "allgather", "alltoall_base", "send/recv").
  std::string primitive;
};

/// RAII recorder: while alive, every collective this thread runs is appended to it (recorders
/// nest; each sees everything run during its life), the collectives of the backward of what
/// this thread built included, on whichever thread autograd runs it (te/distributed/scopes.h).
class CommTrace {
 public:
  CommTrace();
  ~CommTrace();
  CommTrace(const CommTrace&) = delete;
  CommTrace& operator=(const CommTrace&) = delete;

  const std::vector<CommRecord>& records() const { return records_; }
  /// Count / bytes of `kind`, over mesh axis `axis` (empty: every axis).
  int64_t count(Collective kind, const std::string& axis = "") const;
  int64_t bytes(Collective kind, const std::string& axis = "") const;
  int64_t total_count() const { return static_cast<int64_t>(records_.size()); }
  void clear() { records_.clear(); }
  /// One line per (kind, axis): count and bytes, in first-seen order.
  std::string table() const;

  /// Called by the collectives; appends to every live recorder of the scopes in effect.
  static void record(const CommRecord& record);

 private:
  std::shared_ptr<detail::ThreadScopes> scopes_;  // where it is registered
  std::vector<CommRecord> records_;
};

}  // namespace te
