#pragma once

// The communication backend boundary (docs/ARCHITECTURE.md §2, Backends): the primitives one row of
// a mesh runs, whatever carries them. The collectives of collectives.cpp (uneven torch.chunk
// pieces, layouts, CommTrace, desync checks, error wording) are written against this interface
// only; Gloo (gloo_backend.cpp) and NCCL (nccl_backend.cpp) implement it with their own primitives
// and keep their own workarounds.

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "te/distributed/placement.h"
#include "te/distributed/world.h"

namespace te::comm {

/// One rank's end of a communicator over a row's ranks. Every call blocks until this rank's part
/// is done (its output written) or fails: a std::exception whose text says what the backend saw;
/// the caller turns it into a te::Error naming the collective, the mesh axis and missing ranks.
/// Tensors passed in are flat, contiguous, on a device the backend moves, and of one dtype.
/// Each call returns the name of the primitive that carried it (recorded in CommTrace).
class Backend {
 public:
  virtual ~Backend() = default;
  /// Whether this backend moves tensors on `device` (Gloo: CPU, and CUDA through host memory;
  /// NCCL: the CUDA device it was created on).
  virtual bool moves(const c10::Device& device) const = 0;
  /// The dtype a reduction of `dtype` runs in here; the caller converts to it and back, once.
  /// Moves (gather, all-to-all) carry raw bytes and need no such choice.
  virtual at::ScalarType reduce_dtype(at::ScalarType dtype) const = 0;

  /// In place, every rank gets the reduction (sum, avg, max or min) of everyone's `t`.
  virtual const char* all_reduce(at::Tensor& t, ReduceOp op) = 0;
  /// `out` (numel size × in.numel) gets every rank's `in`, row rank s's at piece s.
  virtual const char* all_gather(const at::Tensor& in, at::Tensor& out) = 0;
  /// `in` holds size equal pieces; `out` gets the reduction (sum or avg) of everyone's piece r,
  /// r being this rank's index in the row.
  virtual const char* reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) = 0;
  /// Flat pieces: `in`'s piece s (numel in_sizes[s]) goes to row rank s; `out`'s piece s (numel
  /// out_sizes[s]) comes from row rank s.
  virtual const char* all_to_all(const at::Tensor& in, at::Tensor& out,
                                 const std::vector<int64_t>& in_sizes,
                                 const std::vector<int64_t>& out_sizes) = 0;
  virtual void barrier() = 0;
};

/// How one communicator is set up: the world's store (keys under `key`), this rank's index among
/// `size`, the timeout for every call, and the Gloo-specific choices.
struct BackendSetup {
  c10::intrusive_ptr<c10d::Store> store;  ///< a prefix store private to this communicator
  std::string key;                        ///< for messages: the row's rendezvous key
  std::vector<int64_t> ranks;             ///< for messages: the world ranks of the row
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  CollectiveAlgorithms algorithms;  ///< Gloo: which primitive carries gather / reduce-scatter
  std::string gloo_host;            ///< Gloo: the interface to bind ("" = the default device)
  int cuda_device = 0;              ///< NCCL: the GPU this rank's communicator runs on
};

/// A connected Gloo communicator.
std::unique_ptr<Backend> make_gloo_backend(const BackendSetup& setup);
/// A connected NCCL communicator (rank 0 makes the unique id and shares it through the store).
/// Throws te::Error when this build has no NCCL or the machine has no usable GPU.
std::unique_ptr<Backend> make_nccl_backend(const BackendSetup& setup);
/// A communicator of a simulated world (run_simulated_rank): moves nothing, and every call
/// returns what it would if each rank of the row held what this rank holds (an all-reduce sum
/// multiplies by the row's size, an all-gather repeats this rank's piece, ...). On meta tensors
/// it only gives the outputs their shapes. Any device.
std::unique_ptr<Backend> make_simulated_backend(const BackendSetup& setup);
/// Whether this build can make Gloo communicators (LibTorch with c10d Gloo and Gloo's headers).
bool gloo_built();
/// Whether this build can make NCCL communicators (found with the CUDA toolkit at configure).
bool nccl_built();

/// This thread's world's rendezvous store (run_local_ranks, else init_distributed), to set up
/// communicators of one's own next to te's (use keys of your own prefix); null when not
/// distributed.
c10::intrusive_ptr<c10d::Store> world_store();

// What the NCCL backend decides before it touches a GPU (te::Error where nccl_built() is false).

/// The ncclDataType_t a reduction of `dtype` runs in (bools travel as uint8); te::Error naming
/// the dtype for one NCCL cannot reduce.
int nccl_reduce_type(at::ScalarType dtype);
/// The ncclRedOp_t of `op` (avg is native).
int nccl_reduce_op(ReduceOp op);
/// Rank 0 makes an ncclUniqueId and sets it under "nccl_id" in `store`; every rank gets it from
/// there (waiting up to `timeout`) and returns its bytes.
std::vector<uint8_t> nccl_share_unique_id(c10d::Store& store, int rank,
                                          std::chrono::milliseconds timeout);
/// The first two ranks whose GPU identity (PCI bus id) is the same, if any: NCCL refuses them.
std::optional<std::pair<int, int>> shared_gpu(const std::vector<std::string>& gpu_of_rank);

/// What one rank of a communicator can say before it joins: the GPU it would use (its PCI bus
/// id), or why it cannot join. Every rank posts one, then reads all, so a rank that cannot join
/// stops its peers at once instead of leaving them waiting on keys it never sets.
struct PeerStatus {
  std::string gpu;    ///< PCI bus id; empty when `error` says why there is none
  std::string error;  ///< empty when the rank can join
};
/// Posts this rank's status under "status/<rank>" in `store` and returns every rank's, in order,
/// once all are there. Throws te::Error at once when this rank's own status is an error (its
/// text), when a peer posted one (naming that rank and its reason), and after `timeout` naming
/// the ranks that posted nothing. `ranks` are the world ranks of the row, for messages.
std::vector<PeerStatus> exchange_peer_status(c10d::Store& store, int rank,
                                             const std::vector<int64_t>& ranks,
                                             const PeerStatus& mine,
                                             std::chrono::milliseconds timeout);

}  // namespace te::comm
