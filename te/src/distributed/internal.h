#pragma once

// Internals of the distributed layer shared by its .cpp files: the world, mesh state, the
// communicators of mesh rows and the collectives that move DTensor data. Nothing here names a
// backend: Gloo and NCCL sit behind backend.h.

#include <ATen/Tensor.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "te/distributed/backend.h"
#include "te/distributed/comm_trace.h"
#include "te/distributed/mesh.h"
#include "te/distributed/placement.h"
#include "te/distributed/world.h"
#include "te/scope_stack.h"

namespace te::detail {

using comm::Backend;

/// "0,1,3": a row's world ranks in keys and messages.
inline std::string join_ranks(const std::vector<int64_t>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    out += (i ? "," : "") + std::to_string(ranks[i]);
  }
  return out;
}

/// One rank's membership of a world: its store, the counter that keeps collectively created
/// sub-groups in step across ranks, and the liveness records that let a failed collective name
/// the rank that is missing.
///
/// Store keys: joined/<r> when rank r has joined; left/<r> (the reason) when it left on an
/// error; hb/<r>, a counter a heartbeat thread bumps every 250 ms (process worlds only).
class World {
 public:
  World(c10::intrusive_ptr<c10d::Store> store, int rank, int size, int local_rank,
        DistributedOptions options, std::string gloo_host, bool heartbeat, bool simulated = false);
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  /// Blocks until every rank has joined; te::Error lists those that did not within the timeout.
  void wait_for_all_ranks() const;
  /// Records why this rank is leaving, for its peers' error messages (best effort).
  void mark_left(const std::string& reason) const;
  /// Which of `ranks` (other than this one) look missing, and why: never joined, left with an
  /// error, or stopped responding (heartbeat stalled). Best effort; never throws.
  std::string describe_missing(const std::vector<int64_t>& ranks) const;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  /// A simulated world (run_simulated_rank): this is its only rank in the process; exchanges
  /// return this rank's value for every rank and communicators move nothing
  /// (comm::make_simulated_backend).
  bool simulated() const { return simulated_; }
  /// The world's rendezvous store (keys of te-cpp live under prefixes of their own).
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  const DistributedOptions& options() const { return options_; }
  /// The address this rank's Gloo communicators bind (init_distributed settles it after joining,
  /// before any communicator is made).
  void set_gloo_host(std::string address) { gloo_host_ = std::move(address); }

  /// A communicator of `kind` over `ranks` (world ranks, this rank among them) rendezvousing
  /// under `key`, made for `device` (backends.cpp). Collective over `ranks`.
  std::unique_ptr<Backend> connect(const comm::BackendKind& kind, const std::string& key,
                                   const std::vector<int64_t>& ranks,
                                   const CollectiveAlgorithms& algorithms,
                                   const c10::Device& device) const;
  /// Collective: every rank calls it in the same order and gets the same id.
  int64_t next_mesh_id() { return next_mesh_id_++; }
  /// Collective over the world: publishes this rank's `mine` under `topic` and returns every
  /// rank's, in rank order. A rank that does not arrive within the timeout, or that has left
  /// (an error recorded, a stalled heartbeat) before, is named in a te::Error that says it did
  /// not reach `what`.
  std::vector<std::string> exchange(const std::string& topic, const std::string& mine,
                                    const std::string& what) const;
  /// After an exchange that every rank will fail on: waits (5 s at most) until every rank has
  /// read it, so rank 0, which hosts the store, does not leave before its peers have seen why.
  void linger(const std::string& topic) const;

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  int local_rank_;
  DistributedOptions options_;
  std::string gloo_host_;
  bool simulated_;
  int64_t next_mesh_id_ = 0;
  std::vector<std::string> exchange_or_throw(const std::string& topic, const std::string& mine,
                                             const std::string& what) const;
  struct Heartbeat;
  std::unique_ptr<Heartbeat> heartbeat_;
  void stop_heartbeat();
  /// Leaving a process world: rank 0, which hosts the store, waits until every peer has left,
  /// failed or died (at most the timeout, 10 s at most), so no rank is cut off mid-call.
  void leave_together();
};

/// The world init_distributed joined, and how it joined it (the launcher and the bound address).
struct ProcessWorld {
  std::mutex mutex;
  std::shared_ptr<World> world;
  std::string description;
};
ProcessWorld& process_world();

/// `options` with TE_DIST_TIMEOUT_S, TE_CHECK_COLLECTIVES and TE_COMM_BACKEND applied (te::Error
/// naming a malformed one).
DistributedOptions with_env_overrides(DistributedOptions options);

/// The world of this thread (run_local_ranks), else of the process (init_distributed), else null.
std::shared_ptr<World> current_world();
/// This thread's own world (null when it uses the process's): the innermost of the worlds
/// pushed on this thread (a thread rank's, a DistributedContextScope's; te/scope_stack.h). A
/// null world pushed masks the outer ones: the thread uses the process's.
std::shared_ptr<World> thread_world();
void push_thread_world(const void* owner, std::shared_ptr<World> world);
void pop_thread_world(const void* owner);

/// push_thread_world for the guard's lifetime.
class ThreadWorldScope {
 public:
  explicit ThreadWorldScope(std::shared_ptr<World> world) {
    push_thread_world(this, std::move(world));
  }
  ~ThreadWorldScope() { pop_thread_world(this); }
  ThreadWorldScope(const ThreadWorldScope&) = delete;
  ThreadWorldScope& operator=(const ThreadWorldScope&) = delete;
};

/// The communicators of one row, one per backend, made on demand (backends.cpp): the one the
/// world's options name when the row is made; under "auto" the CPU's then, and a GPU's on the
/// row's first CUDA collective. Every rank of the row asks in the same collective, so making one
/// is collective too.
class RowComm {
 public:
  RowComm(const World* world, std::string key, std::vector<int64_t> ranks,
          CollectiveAlgorithms algorithms);
  /// The backend that carries tensors on `device` (te::Error when the options rule it out).
  Backend& for_device(const c10::Device& device, const std::string& axis);

 private:
  Backend& make(const comm::BackendKind& kind, const c10::Device& device);
  std::pair<std::string, Backend*> choose(const c10::Device& device, const std::string& axis);
  static std::string device_list(const std::vector<c10::DeviceType>& types);

  const World* world_;
  std::string key_;
  std::vector<int64_t> ranks_;
  CollectiveAlgorithms algorithms_;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Backend>> made_;                // by backend name
  std::map<c10::DeviceType, std::pair<std::string, Backend*>> chosen_;  // for_device's answers
  std::unique_ptr<Backend> simulated_;
};

/// This rank's row of one mesh dim: who is in it and the communicators that connect them.
struct Group {
  std::shared_ptr<RowComm> comm;  ///< null when the row has one rank
  int64_t size = 1;
  int64_t rank = 0;  ///< index within the row
  std::string axis;
  std::vector<int64_t> ranks;  ///< world ranks of the row
  int64_t world_rank = 0;
  std::chrono::milliseconds timeout{0};
  CollectiveAlgorithms algorithms;
  const World* world = nullptr;  ///< owned by the mesh state that owns this group
  /// Collectives run on this row so far (desync detection numbers them); shared by copies.
  std::shared_ptr<std::atomic<int64_t>> calls = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace te::detail

namespace te::detail {

struct MeshState {
  std::vector<int64_t> shape;
  std::vector<std::string> names;
  int64_t rank = 0;
  std::vector<int64_t> coords;
  std::vector<Group> groups;  ///< one per mesh dim
  std::shared_ptr<World> world;
  int64_t id = 0;  ///< the world's collective counter at creation (rendezvous keys)
  /// Groups over several mesh dims (group_over), created on first use.
  mutable std::mutex flat_mutex;
  mutable std::map<std::vector<int64_t>, std::shared_ptr<Group>> flat_groups;
};

/// This rank's group spanning mesh dims `dims` (its sub-grid, row-major). For one dim, that dim's
/// group; for several, created on first use (collectively by the sub-grid's ranks, which must
/// all ask for it in the same order) and cached.
const Group& group_over(const MeshState& mesh, const std::vector<int64_t>& dims);

/// Where the DTensor core hands off a parameter's gradient that only needs summing over some
/// mesh rows (data parallelism). The gradients code owns the implementation (GradientBuckets);
/// the core only asks the innermost hook installed on this thread.
class GradientReductionHook {
 public:
  virtual ~GradientReductionHook() = default;
  /// True when the hook took `grad`, this backward's partial contribution to `param`'s gradient,
  /// to sum over the rows of `mesh_dims` later and add to param.grad(); the core then passes
  /// no gradient on (other contributions to param, e.g. of a tied use, accumulate as usual).
  virtual bool defer(const at::Tensor& param, const DeviceMesh& mesh,
                     const std::vector<int64_t>& mesh_dims, const at::Tensor& grad) = 0;
};

/// What one thread has in scope that backward reads (te/distributed/scopes.h): shared with the
/// autograd nodes the thread builds, which lend it to whichever thread runs their backward
/// (several CUDA device threads at once: hence the mutex).
struct ThreadScopes {
  std::mutex mutex;  // guards both stacks (te/scope_stack.h)
  ScopeStack<GradientReductionHook*> hooks;
  ScopeStack<CommTrace*> traces;
};
/// The scopes lent to this thread (ScopeLoan), else its own (made on first use).
std::shared_ptr<ThreadScopes> scopes_in_effect();

/// Installs `hook` in the scopes in effect (innermost first) until removed from the same.
std::shared_ptr<ThreadScopes> install_gradient_hook(GradientReductionHook* hook);
void remove_gradient_hook(ThreadScopes& scopes, GradientReductionHook* hook);
/// The innermost hook in effect on this thread, or null.
GradientReductionHook* current_gradient_hook();

// ---- collectives over one mesh dim's row (all record into CommTrace) ----------------------

/// Concatenates each rank's chunk of `dim` (torch.chunk of `full` over the row) on every rank.
at::Tensor all_gather(const Group& g, const at::Tensor& local, int64_t dim, int64_t full);
/// Reduces full-shaped tensors across the row; returns a new tensor.
at::Tensor all_reduce(const Group& g, const at::Tensor& t, ReduceOp op);
/// Reduces (sum or avg) and keeps this rank's chunk of `dim`.
at::Tensor reduce_scatter(const Group& g, const at::Tensor& t, ReduceOp op, int64_t dim);
/// From `local` chunked on `from_dim` (whole size `from_full`) and whole on `to_dim`, to whole on
/// `from_dim` and chunked on `to_dim`.
at::Tensor all_to_all(const Group& g, const at::Tensor& local, int64_t from_dim, int64_t from_full,
                      int64_t to_dim);
/// Rows [N, ...]: send_rows[s] of them to row rank s, recv_rows[s] from it (DeviceMesh::
/// all_to_all_rows).
at::Tensor all_to_all_rows(const Group& g, const at::Tensor& rows,
                           const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows);
/// A ring step: `t` goes to row rank (rank + shift) mod size, and what row rank (rank - shift)
/// mod size sent comes back (the same shape and dtype on every rank), into `out` when defined.
at::Tensor ring_shift(const Group& g, const at::Tensor& t, int64_t shift, at::Tensor out = {});

}  // namespace te::detail
