#pragma once

// The set of ranks that exchange data: started from the environment (torchrun / mpirun / te-run),
// or as threads of this process (tests, single-machine experiments).

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace te {

/// Which c10d primitive carries a transition on Gloo. Gloo (LibTorch 1.13) has no reduce-scatter
/// and a slow all-gather, so the defaults were chosen by bench/bench_collectives (README): at
/// 16-64 MB on 2 and 4 ranks the padded all-reduce gathers 1.6-2.4x faster than allgather, and
/// all-to-all + local sum reduce-scatters 1.1-2x faster than all-reduce + slice.
enum class GatherAlgorithm {
  kPaddedAllReduce,  ///< each rank writes its chunk into a zeroed full buffer; all-reduce(sum)
  kAllGather,        ///< c10d allgather of equal (padded) chunks
  kAllToAll,         ///< c10d alltoall_base, each rank sending its chunk to every rank
};
enum class ReduceScatterAlgorithm {
  kAllReduceSlice,  ///< all-reduce the full tensor, keep this rank's chunk
  kAllToAllSum,     ///< alltoall_base the chunks, reduce locally
};

/// The primitives behind all-gather and reduce-scatter (all-reduce and all-to-all are direct).
struct CollectiveAlgorithms {
  GatherAlgorithm gather = GatherAlgorithm::kPaddedAllReduce;
  ReduceScatterAlgorithm reduce_scatter = ReduceScatterAlgorithm::kAllToAllSum;
};

/// What carries a mesh row's collectives (docs/ARCHITECTURE.md §2, Backends).
enum class CommBackend {
  kAuto,  ///< by the tensor's device: CPU tensors on Gloo, CUDA tensors on NCCL (made on first use;
          ///< Gloo through host memory when this build has no NCCL)
  kGloo,  ///< everything on Gloo (CUDA tensors through host memory)
  kNccl,  ///< everything on NCCL: CUDA tensors only; each row's communicator is made with the mesh
};

/// "auto", "gloo", "nccl".
const char* to_string(CommBackend backend);

struct DistributedOptions {
  /// How long a collective (or joining the group) may wait for a peer before failing with
  /// te::Error. Overridden by TE_DIST_TIMEOUT_S when set.
  std::chrono::milliseconds timeout = std::chrono::seconds(120);
  /// The default for every mesh of this world (a DeviceMesh may override it).
  CollectiveAlgorithms algorithms;
  /// Desync detection: before every collective the ranks of its row first compare what each is
  /// about to run (kind, mesh axis, dtype, shape in rank-independent terms, and how many
  /// collectives the row has run). A rank that calls another collective, or the same one on
  /// another shape, then gets a te::Error on every rank naming both calls, instead of a hang or
  /// garbage. Costs one small all-gather per collective. TE_CHECK_COLLECTIVES=1 turns it on.
  bool check_collectives = false;
  /// Which backend carries the collectives. TE_COMM_BACKEND=auto|gloo|nccl overrides it.
  CommBackend backend = CommBackend::kAuto;
  /// run_local_ranks: the LibTorch intra-op threads of each rank thread. 0 divides the caller's
  /// count among the ranks (at least one each), as te-run divides the cores among processes:
  /// ranks that each start a team of every core's threads oversubscribe the machine (4 ranks
  /// on 2 cores ran a TransformerLayer step 14x slower, bench/bench_layouts).
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
