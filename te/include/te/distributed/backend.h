#pragma once

// The communication backend boundary (docs/ARCHITECTURE.md §2, Backends): the primitives one row of
// a mesh runs, whatever carries them, and the registry that names the backends. The collectives of
// collectives.cpp (uneven torch.chunk pieces, layouts, CommTrace, desync checks, error wording) are
// written against this interface only; Gloo (gloo_backend.cpp) and NCCL (nccl_backend.cpp)
// implement it with their own primitives and keep their own workarounds. A program adds its own
// backend by implementing Backend and registering a BackendKind:
//
//   static const te::comm::BackendRegistration mine({"mine", {c10::kCPU}, {}, make_mine});
//   // then DistributedOptions::backend = "mine", or TE_COMM_BACKEND=mine

#include <ATen/Tensor.h>
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
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
  /// Point to point, as one batched pair (TE's isend/irecv of a ring step): `send` goes to row
  /// rank `to` while `recv` fills from row rank `from`; every rank of the row calls it at once
  /// with its own pair (a permutation of the row, such as a ring shift), so no pair can wait
  /// on another. The default carries it as an all-to-all whose other pieces are empty (any
  /// backend gets it, `size` being the row's); Gloo and NCCL post a real send and receive.
  virtual const char* send_recv(const at::Tensor& send, int to, at::Tensor& recv, int from,
                                int size);
  virtual void barrier() = 0;
};

/// How one communicator is set up: the world's store (keys under `key`), this rank's index among
/// `size`, the timeout for every call, and the built-in backends' own choices.
struct BackendSetup {
  c10::intrusive_ptr<c10d::Store> store;  ///< a prefix store private to this communicator
  std::string key;                        ///< for messages: the row's rendezvous key
  std::vector<int64_t> ranks;             ///< for messages: the world ranks of the row
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  /// The device the communicator is made for: the CPU, or the rank's GPU (the first tensor's,
  /// or te::local_device() when the row makes it up front).
  c10::Device device{c10::kCPU};
  CollectiveAlgorithms algorithms;  ///< Gloo: which primitive carries gather / reduce-scatter
  std::string gloo_host;            ///< Gloo: the interface to bind ("" = the default device)
};

/// A backend as the registry knows it: the name DistributedOptions::backend and TE_COMM_BACKEND
/// give, the devices whose tensors it moves, and its factory.
struct BackendKind {
  std::string name;
  /// Device types whose tensors it moves (Gloo: CPU, and CUDA through host memory).
  std::vector<c10::DeviceType> carries;
  /// Device types it is the first choice for under "auto" (Gloo: CPU; NCCL: CUDA). "auto" takes
  /// the first built backend, in registration order (the built-in ones first), that prefers a
  /// tensor's device type, else the first that carries it: a program's backend preferred for
  /// the CPU is picked by "auto" only where Gloo is not built; name it to use it everywhere.
  std::vector<c10::DeviceType> preferred_for;
  /// Makes a connected communicator; collective over setup.ranks. A std::exception (other than
  /// te::Error) becomes a te::Error naming the row and the ranks that did not join.
  std::function<std::unique_ptr<Backend>(const BackendSetup&)> make;
  /// Whether this build can make it: "auto" passes over one that cannot; asking for it by name
  /// gets the factory's own te::Error.
  bool built = true;

  bool carries_type(c10::DeviceType type) const {
    return std::find(carries.begin(), carries.end(), type) != carries.end();
  }
};

/// Adds `kind` to the registry (thread-safe). te::Error when its name is empty, "auto", or taken,
/// or when it has no factory or carries no device type.
void register_backend(BackendKind kind);
/// register_backend at static initialisation: one line beside a backend's implementation.
struct BackendRegistration {
  explicit BackendRegistration(BackendKind kind) { register_backend(std::move(kind)); }
};
/// The registered backends' names, in order of registration (the built-in gloo and nccl first).
std::vector<std::string> backend_names();
/// The backend registered as `name`. te::Error naming `what` (who asked: an option, a variable)
/// and every registered name when there is none.
BackendKind find_backend(const std::string& name, const std::string& what);
/// The backend "auto" picks for tensors of `type`; nullopt when no built backend carries them.
std::optional<BackendKind> auto_backend(c10::DeviceType type);

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

}  // namespace te::comm
