#pragma once

// The set of ranks that exchange data: started from the environment (torchrun / mpirun / te-run),
// or as threads of this process (tests, single-machine experiments).

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "te/distributed/gloo.h"

namespace te {

struct DistributedOptions {
  /// How long a collective (or joining the group) may wait for a peer before failing with
  /// te::Error. Overridden by TE_DIST_TIMEOUT_S when set.
  std::chrono::milliseconds timeout = std::chrono::seconds(120);
  /// Gloo's primitives for every mesh of this world (te/distributed/gloo.h; a DeviceMesh may
  /// override them).
  CollectiveAlgorithms algorithms;
  /// Desync detection: before every collective the ranks of its row first compare what each is
  /// about to run (kind, mesh axis, dtype, shape in rank-independent terms, and how many
  /// collectives the row has run). A rank that calls another collective, or the same one on
  /// another shape, then gets a te::Error on every rank naming both calls, instead of a hang or
  /// garbage. Costs one small all-gather per collective. TE_CHECK_COLLECTIVES=1 turns it on.
  bool check_collectives = false;
  /// Which backend carries a mesh row's collectives (docs/ARCHITECTURE.md §2, Backends): the name
  /// of a registered one (te/distributed/backend.h: "gloo", "nccl", or one registered by the
  /// program), which then carries everything and is made with the row; or "auto": by the
  /// tensor's device, CPU tensors on Gloo and CUDA tensors on NCCL (made on a row's first CUDA
  /// collective; Gloo through host memory when this build has no NCCL). TE_COMM_BACKEND
  /// overrides it; a name nobody registered is a te::Error listing those that are.
  std::string backend = "auto";
  /// run_local_ranks: the LibTorch intra-op threads of each rank thread. 0 divides the caller's
  /// count among the ranks (at least one each), as te-run divides the cores among processes:
  /// ranks that each start a team of every core's threads oversubscribe the machine.
  int threads_per_rank = 0;
  /// init_distributed: the interface (e.g. "eth0") or this host's address that Gloo binds and
  /// advertises to the other ranks. Empty: GLOO_SOCKET_IFNAME when set, else this host's address
  /// on the route to MASTER_ADDR (127.0.0.1 when MASTER_ADDR is a loopback address). NCCL picks
  /// its own interface: NCCL_SOCKET_IFNAME reaches it unchanged.
  std::string interface;
};

/// Joins the process group its launcher described (te/runtime/launch.h, read_launch_environment):
/// torchrun's and te-run's RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; Open MPI's
/// OMPI_COMM_WORLD_* (MASTER_ADDR/MASTER_PORT name the rendezvous); or SLURM's srun (the first
/// host of the step as master unless MASTER_ADDR is set). Rank 0 hosts the TCP store.
///
/// Across hosts: Gloo binds the address DistributedOptions::interface chooses (see there), and
/// before any communicator is made every rank publishes its address and the ranks check together
/// that none advertises a loopback address to a peer on another host and that each reaches every
/// other's; either failure is a te::Error on every rank at once, naming both ranks, both
/// addresses and the variable to set (GLOO_SOCKET_IFNAME).
///
/// Throws te::Error naming a missing or malformed variable. A second call is an error. Joining a
/// world (here or in run_local_ranks) sets SIGPIPE to ignored if it had the default disposition,
/// so a peer that dies shows up as a te::Error from the collective.
void init_distributed(const DistributedOptions& options = {});

/// How init_distributed joined: the launcher's environment it read and the address Gloo binds,
/// one line ("torchrun environment: rank 1 of 4, ...; Gloo binds 10.0.0.2 (chosen by the route to
/// MASTER_ADDR=10.0.0.1)"); empty when this process has not joined a world.
std::string launch_description();

/// Leaves the process group joined by init_distributed (no-op when none); also done at exit.
/// Rank 0 hosts the rendezvous store, so it leaves last: it waits until every peer has left,
/// failed or died (heartbeat stalled), for at most the timeout (10 s at most). A rank that
/// finishes early therefore never cuts off a peer still talking to the store.
void shutdown_distributed();

/// Runs fn(rank) on `world_size` threads of this process, each a rank with its own Gloo process
/// group over a shared in-memory store. The caller's sharding context (rules, MeshResource) is
/// carried into every rank, and each rank thread gets its share of the intra-op threads
/// (DistributedOptions::threads_per_rank; the caller's count is restored after). Waits for all
/// ranks; if any threw, rethrows the first exception raised (in time) after all have finished.
void run_local_ranks(int world_size, const std::function<void(int rank)>& fn,
                     const DistributedOptions& options = {});

/// Runs fn() on this thread as rank `rank` of a simulated world of `world_size` ranks, the only
/// one that runs: meshes of any shape can be made, and every collective goes through the usual
/// code (placements, uneven pieces, CommTrace records) but moves no bytes; each returns what it
/// would if every rank held what this rank holds. On meta tensors (te/runtime/meta.h) this runs
/// a model's step on a mesh of thousands of ranks in one process to size it (te::nn::plan).
/// The previous world of this thread is back in effect afterwards, also when fn throws.
void run_simulated_rank(int world_size, int rank, const std::function<void()>& fn,
                        const DistributedOptions& options = {});
/// This thread's rank: its local rank inside run_local_ranks, else the process's rank after
/// init_distributed, else 0.
int world_rank();
/// The number of ranks this thread belongs to (1 when not distributed).
int world_size();
/// True when this thread belongs to a world of more than one rank.
bool is_distributed();
/// This rank's index on its machine: LOCAL_RANK as te-run / torchrun set it (the rank when unset),
/// a thread rank's own rank, 0 when not distributed.
int local_rank();
/// The device this rank computes on: device_for_local_rank(local_rank(), the GPUs this LibTorch
/// sees). One GPU per rank, as NCCL requires.
c10::Device local_device();
/// The device of the rank with this LOCAL_RANK on a host with `gpus` GPUs: cuda:local_rank, or
/// the CPU when there are none. Throws te::Error naming the rank when local_rank is not one of
/// the host's GPUs (more ranks started on a host than it has GPUs).
c10::Device device_for_local_rank(int local_rank, int gpus);

}  // namespace te
