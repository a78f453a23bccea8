// The NCCL backend: CUDA tensors through NCCL's own collectives (all-reduce, all-gather,
// reduce-scatter; all-to-all as grouped send/recv), called directly. Rank 0 of each row makes the
// communicator's unique id and shares it through the world's c10d store. Communicators are
// non-blocking, so a peer that never comes cannot hang a rank: every call is followed by polling
// the communicator's asynchronous error and an event on the stream until the timeout, and then
// ncclCommAbort. Calls run on LibTorch's current CUDA stream when LibTorch has CUDA.
//
// Built when CMake finds NCCL with the CUDA toolkit (TE_WITH_NCCL); otherwise the functions at
// the end throw a te::Error saying this build has no NCCL.

#include "nccl_seams.h"
#include "te/distributed/backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>

#include "te/error.h"

namespace te::comm {
namespace {
std::string join_ranks(const std::vector<int64_t>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}
}  // namespace
}  // namespace te::comm

#ifdef TE_WITH_NCCL

#include <cuda_runtime.h>
#include <nccl.h>

#include "te/compat.h"

#ifdef TE_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace te::comm {

namespace nccl {  // the mappings and the id exchange, in NCCL types

ncclDataType_t reduce_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return ncclFloat32;
    case at::kDouble:
      return ncclFloat64;
    case at::kHalf:
      return ncclFloat16;
    case at::kBFloat16:
      return ncclBfloat16;
    case at::kInt:
      return ncclInt32;
    case at::kLong:
      return ncclInt64;
    case at::kChar:
      return ncclInt8;
    case at::kByte:
    case at::kBool:  // 0/1 bytes; the caller reduces them as uint8
      return ncclUint8;
#if TE_HAS_FLOAT8
    case at::kFloat8_e4m3fn:
      return ncclFloat8e4m3;
    case at::kFloat8_e5m2:
      return ncclFloat8e5m2;
#endif
    default:
      break;
  }
  TE_FAIL("NCCL cannot reduce ", c10::toString(dtype),
          " tensors; convert to a type it reduces (float, double, half, bfloat16, int8, uint8, "
          "int32, int64) first");
}

ncclRedOp_t reduce_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

ncclUniqueId share_unique_id(c10d::Store& store, int rank, std::chrono::milliseconds timeout) {
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t r = ncclGetUniqueId(&id);
    TE_CHECK(r == ncclSuccess, "ncclGetUniqueId failed: ", ncclGetErrorString(r));
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set("nccl_id", std::vector<uint8_t>(bytes, bytes + sizeof(id)));
    return id;
  }
  try {
    store.wait({"nccl_id"}, timeout);
  } catch (const std::exception&) {
    TE_FAIL("rank ", rank, " of an NCCL communicator waited ", timeout.count() / 1000.0,
            " s for rank 0's unique id, which never came: rank 0 stopped before making it, or "
            "runs other collective steps; every rank must build the same meshes in order");
  }
  const std::vector<uint8_t> bytes = store.get("nccl_id");
  TE_CHECK(bytes.size() == sizeof(id), "internal: the NCCL unique id in the store has ",
           bytes.size(), " bytes, expected ", sizeof(id));
  std::memcpy(&id, bytes.data(), sizeof(id));
  return id;
}

}  // namespace nccl

namespace {

// Makes `device` current for the scope, and restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceScope() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

// The GPU index a communicator is made for (the CPU stands for none: -1, refused below).
int cuda_device_of(const BackendSetup& setup) {
  return setup.device.is_cuda() ? (setup.device.has_index() ? setup.device.index() : 0) : -1;
}

// The GPU this rank's communicator would run on, or why it cannot have one.
PeerStatus own_status(const BackendSetup& setup) {
  const int world_rank = static_cast<int>(setup.ranks.at(static_cast<std::size_t>(setup.rank)));
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  PeerStatus status;
  if (e != cudaSuccess || count == 0) {
    status.error =
        "NCCL needs a CUDA GPU on every rank, and rank " + std::to_string(world_rank) +
        " has none (CUDA says: " +
        (e == cudaSuccess ? std::string("no devices") : cudaGetErrorString(e)) +
        "); run on a GPU machine, or move CPU tensors on Gloo (DistributedOptions::backend "
        "\"gloo\" or \"auto\"; TE_COMM_BACKEND=gloo)";
  } else if (cuda_device_of(setup) < 0 || cuda_device_of(setup) >= count) {
    status.error = "rank " + std::to_string(world_rank) +
                   " would run NCCL on cuda:" + std::to_string(cuda_device_of(setup)) +
                   ", but this machine has " + std::to_string(count) +
                   " GPU(s): start at most one rank per GPU (te-run --nproc " +
                   std::to_string(count) +
                   "); LOCAL_RANK picks a process rank's GPU, a thread rank's is its rank";
  } else {
    char bus[64] = {0};
    cudaDeviceGetPCIBusId(bus, sizeof(bus), cuda_device_of(setup));
    status.gpu = bus;
  }
  return status;
}

class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(const BackendSetup& setup)
      : device_(cuda_device_of(setup)), size_(setup.size), timeout_(setup.timeout) {
    // Every rank posts its GPU or why it has none before anything can stop it, so a rank that
    // cannot join names itself to its peers at once (they would otherwise wait on its key).
    const std::vector<PeerStatus> peers = exchange_peer_status(
        *setup.store, setup.rank, setup.ranks, own_status(setup), setup.timeout);
    std::vector<std::string> gpus;
    for (const PeerStatus& p : peers) gpus.push_back(p.gpu);
    if (const auto dup = shared_gpu(gpus)) {
      TE_FAIL("ranks ", setup.ranks[static_cast<std::size_t>(dup->first)], " and ",
              setup.ranks[static_cast<std::size_t>(dup->second)],
              " of the NCCL communicator of "
              "ranks [",
              join_ranks(setup.ranks), "] are both on GPU ", gpus[dup->first],
              ": NCCL refuses two ranks of one communicator on one GPU. Start one rank per GPU "
              "(LOCAL_RANK picks it; te::local_device()), or use Gloo (TE_COMM_BACKEND=gloo)");
    }
    const ncclUniqueId id = nccl::share_unique_id(*setup.store, setup.rank, timeout_);
    DeviceScope scope(device_);
#ifndef TE_TORCH_CUDA
    cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking);
#endif
    cudaEventCreateWithFlags(&done_, cudaEventDisableTiming);
    cudaMalloc(&scratch_, sizeof(float));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    check(ncclCommInitRankConfig(&comm_, size_, id, setup.rank, &config), "ncclCommInitRank");
    settle("ncclCommInitRank");
  }

  ~NcclBackend() override {
    DeviceScope scope(device_);
    if (comm_ != nullptr) {
      if (aborted_) {
        // Already aborted: nothing left to free.
      } else {
        ncclCommDestroy(comm_);
      }
    }
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (own_stream_ != nullptr) cudaStreamDestroy(own_stream_);
  }

  bool moves(const c10::Device& device) const override {
    return device.is_cuda() && (!device.has_index() || device.index() == device_);
  }
  at::ScalarType reduce_dtype(at::ScalarType dtype) const override {
    if (dtype == at::kBool) return at::kByte;
    nccl::reduce_type(dtype);  // throws for a type NCCL cannot reduce
    return dtype;
  }

  const char* all_reduce(at::Tensor& t, ReduceOp op) override {
    run("ncclAllReduce", [&](cudaStream_t s) {
      return ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()),
                           nccl::reduce_type(t.scalar_type()), nccl::reduce_op(op), comm_, s);
    });
    return "ncclAllReduce";
  }

  const char* all_gather(const at::Tensor& in, at::Tensor& out) override {
    run("ncclAllGather", [&](cudaStream_t s) {
      return ncclAllGather(in.data_ptr(), out.data_ptr(), in.nbytes(), ncclUint8, comm_, s);
    });
    return "ncclAllGather";
  }

  const char* reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    run("ncclReduceScatter", [&](cudaStream_t s) {
      return ncclReduceScatter(in.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                               nccl::reduce_type(in.scalar_type()), nccl::reduce_op(op), comm_, s);
    });
    return "ncclReduceScatter";
  }

  const char* all_to_all(const at::Tensor& in, at::Tensor& out,
                         const std::vector<int64_t>& in_sizes,
                         const std::vector<int64_t>& out_sizes) override {
    const int64_t item = static_cast<int64_t>(in.element_size());
    run("ncclSend/ncclRecv", [&](cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      auto* send = static_cast<char*>(in.data_ptr());
      auto* recv = static_cast<char*>(out.data_ptr());
      for (int peer = 0; peer < size_; ++peer) {
        const auto n_in = static_cast<size_t>(in_sizes[peer] * item);
        const auto n_out = static_cast<size_t>(out_sizes[peer] * item);
        if (n_in > 0) r = ncclSend(send, n_in, ncclUint8, peer, comm_, s);
        if (r == ncclSuccess && n_out > 0) r = ncclRecv(recv, n_out, ncclUint8, peer, comm_, s);
        if (r != ncclSuccess && r != ncclInProgress) break;
        send += n_in;
        recv += n_out;
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
    return "ncclSend/ncclRecv";
  }

  const char* send_recv(const at::Tensor& send, int to, at::Tensor& recv, int from,
                        int /*size*/) override {
    run("ncclSend/ncclRecv", [&](cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      if (send.nbytes() > 0) {
        r = ncclSend(send.data_ptr(), send.nbytes(), ncclUint8, to, comm_, s);
      }
      if ((r == ncclSuccess || r == ncclInProgress) && recv.nbytes() > 0) {
        r = ncclRecv(recv.data_ptr(), recv.nbytes(), ncclUint8, from, comm_, s);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess && r != ncclInProgress ? r : end;
    });
    return "ncclSend/ncclRecv";
  }

  void barrier() override {
    run("barrier", [&](cudaStream_t s) {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, s);
    });
  }

 private:
  cudaStream_t stream() const {
#ifdef TE_TORCH_CUDA
    return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_)).stream();
#else
    return own_stream_;
#endif
  }

  void check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    const std::string detail = comm_ != nullptr ? ncclGetLastError(comm_) : "";
    abort();
    throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r) +
                             (detail.empty() ? "" : " (" + detail + ")"));
  }

  // Waits until the communicator has no call in progress (non-blocking mode), failing on its
  // asynchronous error or at the timeout.
  void settle(const char* what) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) check(state, what);
      if (std::chrono::steady_clock::now() > deadline) timed_out(what);
      std::this_thread::yield();
    }
  }

  template <typename Launch>
  void run(const char* what, Launch launch) {
    TE_CHECK(!aborted_, "the NCCL communicator was aborted by an earlier failure; make a new mesh");
    DeviceScope scope(device_);
    const cudaStream_t s = stream();
    check(launch(s), what);
    settle(what);
    cudaEventRecord(done_, s);
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      const cudaError_t e = cudaEventQuery(done_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) {
        abort();
        throw std::runtime_error(std::string(what) + ": CUDA error " + cudaGetErrorString(e));
      }
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) check(state, what);
      if (std::chrono::steady_clock::now() > deadline) timed_out(what);
      std::this_thread::yield();
    }
  }

  [[noreturn]] void timed_out(const char* what) {
    abort();
    throw std::runtime_error(std::string(what) + " did not complete within " +
                             std::to_string(timeout_.count() / 1000.0) +
                             " s; the NCCL communicator was aborted (ncclCommAbort)");
  }

  void abort() {
    if (comm_ != nullptr && !aborted_) {
      ncclCommAbort(comm_);
      aborted_ = true;
    }
  }

  int device_;
  int size_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  bool aborted_ = false;
  cudaStream_t own_stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  void* scratch_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> make_nccl_backend(const BackendSetup& setup) {
  return std::make_unique<NcclBackend>(setup);
}

bool nccl_built() { return true; }

int nccl_reduce_type(at::ScalarType dtype) { return static_cast<int>(nccl::reduce_type(dtype)); }

int nccl_reduce_op(ReduceOp op) { return static_cast<int>(nccl::reduce_op(op)); }

std::vector<uint8_t> nccl_share_unique_id(c10d::Store& store, int rank,
                                          std::chrono::milliseconds timeout) {
  const ncclUniqueId id = nccl::share_unique_id(store, rank, timeout);
  const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
  return {bytes, bytes + sizeof(id)};
}

}  // namespace te::comm

#else  // no NCCL in this build

namespace te::comm {

std::unique_ptr<Backend> make_nccl_backend(const BackendSetup& setup) {
  TE_FAIL("rank ", setup.ranks.at(static_cast<std::size_t>(setup.rank)),
          " was asked for an NCCL communicator, but this te-cpp was built without NCCL (CMake "
          "found no CUDA toolkit with nccl.h); rebuild with the toolkit, or use Gloo "
          "(DistributedOptions::backend \"gloo\" or \"auto\"; TE_COMM_BACKEND=gloo)");
}

bool nccl_built() { return false; }

namespace {
[[noreturn]] void no_nccl() {
  TE_FAIL("this te-cpp was built without NCCL (CMake found no CUDA toolkit with nccl.h)");
}
}  // namespace

int nccl_reduce_type(at::ScalarType) { no_nccl(); }
int nccl_reduce_op(ReduceOp) { no_nccl(); }
std::vector<uint8_t> nccl_share_unique_id(c10d::Store&, int, std::chrono::milliseconds) {
  no_nccl();
}

}  // namespace te::comm

#endif

namespace te::comm {

std::optional<std::pair<int, int>> shared_gpu(const std::vector<std::string>& gpu_of_rank) {
  for (std::size_t a = 0; a < gpu_of_rank.size(); ++a) {
    for (std::size_t b = a + 1; b < gpu_of_rank.size(); ++b) {
      if (gpu_of_rank[a] == gpu_of_rank[b]) {
        return std::make_pair(static_cast<int>(a), static_cast<int>(b));
      }
    }
  }
  return std::nullopt;
}

std::vector<PeerStatus> exchange_peer_status(c10d::Store& store, int rank,
                                             const std::vector<int64_t>& ranks,
                                             const PeerStatus& mine,
                                             std::chrono::milliseconds timeout) {
  // One key per rank: "g<bus id>" or "e<reason>".
  const std::string text = mine.error.empty() ? "g" + mine.gpu : "e" + mine.error;
  store.set("status/" + std::to_string(rank), std::vector<uint8_t>(text.begin(), text.end()));
  if (!mine.error.empty()) TE_FAIL(mine.error);
  const int size = static_cast<int>(ranks.size());
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("status/" + std::to_string(r));
  std::vector<std::optional<PeerStatus>> all(static_cast<std::size_t>(size));
  // Waits in slices of 250 ms; after each, what has been posted is read, so a peer's error is
  // named within a slice of its posting, and the store sees one look per absent peer per slice.
  while (true) {
    bool complete = false;
    try {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      store.wait(keys, std::max(std::chrono::milliseconds(1),
                                std::min(left, std::chrono::milliseconds(250))));
      complete = true;
    } catch (const std::exception&) {
    }
    std::string missing;
    for (int r = 0; r < size; ++r) {
      auto& slot = all[static_cast<std::size_t>(r)];
      const std::string& k = keys[static_cast<std::size_t>(r)];
      if (!slot && (complete || store.check({k}))) {
        const auto bytes = store.get(k);
        const std::string v(bytes.begin(), bytes.end());
        PeerStatus p;
        (v.rfind('e', 0) == 0 ? p.error : p.gpu) = v.substr(1);
        TE_CHECK(p.error.empty(), "rank ", ranks.at(static_cast<std::size_t>(rank)),
                 " cannot join the NCCL communicator of ranks [", join_ranks(ranks), "]: rank ",
                 ranks.at(static_cast<std::size_t>(r)), " cannot: ", p.error);
        slot = p;
      }
      if (!slot) missing += (missing.empty() ? "" : ", ") + std::to_string(ranks[r]);
    }
    if (missing.empty()) break;
    TE_CHECK(std::chrono::steady_clock::now() < deadline, "rank ",
             ranks.at(static_cast<std::size_t>(rank)), ": rank(s) ", missing,
             " of the NCCL communicator of ranks [", join_ranks(ranks), "] posted nothing within ",
             timeout.count() / 1000.0,
             " s; every rank must build the same meshes in the same order (raise the timeout "
             "with TE_DIST_TIMEOUT_S if they are only slow)");
  }
  std::vector<PeerStatus> out;
  for (auto& p : all) out.push_back(*p);
  return out;
}

}  // namespace te::comm
