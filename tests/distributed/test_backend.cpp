// The communication backend boundary: choosing a backend (options, environment), the errors for a
// backend this machine or build cannot give, and what the NCCL backend decides before touching a
// GPU (type and operator mappings, the unique-id exchange over the world's store, the check for
// two ranks on one GPU). NCCL collectives themselves need a GPU: scripts/gpu-check.sh runs them.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "../../te/src/distributed/nccl_seams.h"
#include "../expect_error.h"
#include "te/distributed.h"
#include "te/distributed/backend.h"

#ifdef TE_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>
#endif

namespace te {
namespace {

struct EnvScope {
  EnvScope(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~EnvScope() { ::unsetenv(name_); }
  const char* name_;
};

TEST(CommBackendOption, NamesAndEnvironment) {
  EXPECT_EQ(comm::backend_names(), (std::vector<std::string>{"gloo", "nccl"}));
  EXPECT_EQ(DistributedOptions().backend, "auto");
  {
    EnvScope env("TE_COMM_BACKEND", "mpi");
    EXPECT_ERROR(run_local_ranks(1, [](int) {}), "TE_COMM_BACKEND='mpi' is not auto, gloo or nccl");
  }
  DistributedOptions options;
  options.backend = "mpi";
  EXPECT_ERROR(run_local_ranks(
                   1, [](int) {}, options),
               "DistributedOptions::backend='mpi' is not auto, gloo or nccl");
}

// The registry refuses a backend it could not name or make, and keeps the ones it has.
TEST(BackendRegistry, RefusesNamelessTakenAndIncompleteBackends) {
  const auto make = [](const comm::BackendSetup&) -> std::unique_ptr<comm::Backend> {
    return nullptr;
  };
  EXPECT_ERROR(comm::register_backend({"gloo", {c10::kCPU}, {}, make}),
               "a backend named 'gloo' is already registered; give this one another name");
  EXPECT_ERROR(comm::register_backend({"auto", {c10::kCPU}, {}, make}),
               "register_backend: the name 'auto' cannot name a backend");
  EXPECT_ERROR(comm::register_backend({"", {c10::kCPU}, {}, make}),
               "register_backend: the name '' cannot name a backend");
  EXPECT_ERROR(comm::register_backend({"late", {c10::kCPU}, {}, nullptr}),
               "backend 'late' has no factory (BackendKind::make)");
  EXPECT_ERROR(comm::register_backend({"late", {}, {}, make}),
               "backend 'late' carries no device type");
  EXPECT_EQ(comm::backend_names(), (std::vector<std::string>{"gloo", "nccl"}));
  EXPECT_ERROR(comm::find_backend("late", "TE_COMM_BACKEND"),
               "TE_COMM_BACKEND='late' is not auto, gloo or nccl");
  // "auto": Gloo for the CPU; NCCL for CUDA where built, else Gloo through host memory.
  ASSERT_TRUE(comm::auto_backend(c10::kCPU).has_value() == comm::gloo_built());
  if (comm::gloo_built()) EXPECT_EQ(comm::auto_backend(c10::kCPU)->name, "gloo");
  if (comm::nccl_built()) EXPECT_EQ(comm::auto_backend(c10::kCUDA)->name, "nccl");
  EXPECT_FALSE(comm::auto_backend(c10::kMeta).has_value());
}

// One GPU per rank: LOCAL_RANK picks it, the CPU when the host has none, and a rank beyond the
// host's GPUs is refused with what to do (te-run starting more ranks than GPUs).
TEST(LocalDevice, LocalRankPicksTheGpuAndMoreRanksThanGpusAreRefused) {
  EXPECT_EQ(device_for_local_rank(0, 0), c10::Device(c10::kCPU));
  EXPECT_EQ(device_for_local_rank(3, 0), c10::Device(c10::kCPU));
  EXPECT_EQ(device_for_local_rank(0, 8), c10::Device(c10::kCUDA, 0));
  EXPECT_EQ(device_for_local_rank(7, 8), c10::Device(c10::kCUDA, 7));
  EXPECT_ERROR(device_for_local_rank(1, 1),
               "has LOCAL_RANK 1, but this host has 1 GPU(s): start at most one rank per GPU on "
               "each host (te-run --nproc 1)");
  EXPECT_ERROR(device_for_local_rank(-1, 2), "has LOCAL_RANK -1");
  // Without CUDA in this LibTorch, every rank computes on the CPU.
  if (!at::hasCUDA()) EXPECT_EQ(local_device(), c10::Device(c10::kCPU));
}

// Forcing Gloo moves CPU tensors exactly as the default does.
TEST(CommBackendOption, GlooByOptionAndByEnvironmentMovesCpuTensors) {
  if (!comm::gloo_built()) GTEST_SKIP() << "this te-cpp was built without Gloo";
  for (bool by_env : {false, true}) {
    DistributedOptions options;
    std::unique_ptr<EnvScope> env;
    if (by_env) {
      env = std::make_unique<EnvScope>("TE_COMM_BACKEND", "gloo");
    } else {
      options.backend = "gloo";
    }
    run_local_ranks(
        2,
        [](int rank) {
          DeviceMesh mesh({2}, {"x"});
          const DTensor p = DTensor::from_local(at::full({3}, rank + 1.0), mesh, {Partial{}});
          EXPECT_TRUE(at::equal(p.full_tensor(), at::full({3}, 3.0)));
        },
        options);
  }
}

// NCCL asked for where it cannot run: the mesh fails on every rank with a sentence that says why.
TEST(CommBackendOption, NcclWithoutAGpuOrWithoutNcclIsNamed) {
  std::string expected;
#ifdef TE_WITH_NCCL
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (count >= 2) GTEST_SKIP() << count << " GPUs: two thread ranks can run NCCL here";
  expected = count == 0 ? "NCCL needs a CUDA GPU on every rank, and rank"
                        : "would run NCCL on cuda:1, but this machine has 1 GPU(s)";
#else
  expected = "this te-cpp was built without NCCL";
#endif
  DistributedOptions options;
  options.backend = "nccl";
  options.timeout = std::chrono::seconds(60);
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(run_local_ranks(
                   2,
                   [&](int rank) {
                     try {
                       DeviceMesh mesh({2}, {"x"});
                     } catch (const Error& e) {
                       errors[static_cast<std::size_t>(rank)] = e.what();
                       throw;
                     }
                   },
                   options),
               Error);
  // Every rank learns why at once: no rank waits out the timeout for a peer that stopped.
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  bool named = false;
  for (const std::string& e : errors) named = named || e.find(expected) != std::string::npos;
  EXPECT_TRUE(named) << "expected: " << expected << "\nrank 0: " << errors[0]
                     << "\nrank 1: " << errors[1];
}

// Before an NCCL communicator is made, each rank posts its GPU or why it has none. A rank that
// cannot join stops its peers at once with its reason (before, a peer waited in the store's
// get for c10d's default 300 s); a rank that posts nothing is named at the world's timeout.
std::vector<std::string> peer_status_errors(const std::vector<comm::PeerStatus>& statuses,
                                            std::chrono::milliseconds timeout,
                                            std::vector<std::vector<comm::PeerStatus>>* got) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  const int n = static_cast<int>(statuses.size());
  std::vector<int64_t> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(10 + r);  // world ranks differ from row ranks
  std::vector<std::string> errors(statuses.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    if (statuses[r].gpu == "absent") continue;  // this rank never posts
    threads.emplace_back([&, r] {
      try {
        auto all = comm::exchange_peer_status(*store, r, ranks, statuses[r], timeout);
        if (got) (*got)[r] = all;
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(PeerStatus, EveryRankGetsEveryGpuInRankOrder) {
  std::vector<std::vector<comm::PeerStatus>> got(3);
  const auto errors =
      peer_status_errors({{"0000:01:00.0", ""}, {"0000:02:00.0", ""}, {"0000:03:00.0", ""}},
                         std::chrono::seconds(20), &got);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(errors[r], "");
    ASSERT_EQ(got[r].size(), 3u);
    for (int k = 0; k < 3; ++k)
      EXPECT_EQ(got[r][k].gpu, "0000:0" + std::to_string(k + 1) + ":00.0");
  }
}

TEST(PeerStatus, ARankThatCannotJoinStopsItsPeersAtOnceWithItsReason) {
  const auto start = std::chrono::steady_clock::now();
  const auto errors =
      peer_status_errors({{"0000:01:00.0", ""},
                          {"", "rank 11 would run NCCL on cuda:1, but this machine has 1 GPU(s)"}},
                         std::chrono::seconds(60), nullptr);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 30.0) << "a peer's reason must not wait out the 60 s timeout";
  EXPECT_NE(errors[0].find("rank 10 cannot join the NCCL communicator of ranks [10, 11]: rank 11 "
                           "cannot: rank 11 would run NCCL on cuda:1, but this machine has 1 GPU"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("rank 11 would run NCCL on cuda:1"), std::string::npos) << errors[1];
}

TEST(PeerStatus, ARankThatPostsNothingIsNamedAtTheTimeout) {
  const auto errors =
      peer_status_errors({{"0000:01:00.0", ""}, {"absent", ""}, {"0000:03:00.0", ""}},
                         std::chrono::milliseconds(300), nullptr);
  for (int r : {0, 2}) {
    EXPECT_NE(errors[r].find("rank(s) 11 of the NCCL communicator of ranks [10, 11, 12] posted "
                             "nothing within 0.3 s"),
              std::string::npos)
        << errors[r];
  }
}

#ifdef TE_WITH_NCCL

TEST(NcclSupport, TypesAndOperators) {
  EXPECT_EQ(comm::nccl_reduce_type(at::kFloat), ncclFloat32);
  EXPECT_EQ(comm::nccl_reduce_type(at::kDouble), ncclFloat64);
  EXPECT_EQ(comm::nccl_reduce_type(at::kHalf), ncclFloat16);
  EXPECT_EQ(comm::nccl_reduce_type(at::kBFloat16), ncclBfloat16);
  EXPECT_EQ(comm::nccl_reduce_type(at::kInt), ncclInt32);
  EXPECT_EQ(comm::nccl_reduce_type(at::kLong), ncclInt64);
  EXPECT_EQ(comm::nccl_reduce_type(at::kChar), ncclInt8);
  EXPECT_EQ(comm::nccl_reduce_type(at::kByte), ncclUint8);
  EXPECT_EQ(comm::nccl_reduce_type(at::kBool), ncclUint8);
  EXPECT_ERROR(comm::nccl_reduce_type(at::kShort), "NCCL cannot reduce Short tensors");
  EXPECT_ERROR(comm::nccl_reduce_type(at::kComplexFloat),
               "NCCL cannot reduce ComplexFloat tensors");
  EXPECT_EQ(comm::nccl_reduce_op(ReduceOp::kSum), ncclSum);
  EXPECT_EQ(comm::nccl_reduce_op(ReduceOp::kAvg), ncclAvg);
  EXPECT_EQ(comm::nccl_reduce_op(ReduceOp::kMax), ncclMax);
  EXPECT_EQ(comm::nccl_reduce_op(ReduceOp::kMin), ncclMin);
}

TEST(NcclSupport, TwoRanksOnOneGpuAreFound) {
  EXPECT_FALSE(comm::shared_gpu({"0000:01:00.0", "0000:02:00.0"}).has_value());
  const auto dup = comm::shared_gpu({"0000:01:00.0", "0000:02:00.0", "0000:01:00.0"});
  ASSERT_TRUE(dup.has_value());
  EXPECT_EQ(dup->first, 0);
  EXPECT_EQ(dup->second, 2);
}

// Thread ranks share the id rank 0 made through their world's store; another key, another id.
TEST(NcclSupport, ThreadRanksShareRankZerosUniqueIdThroughTheWorldStore) {
  std::vector<std::vector<uint8_t>> first(3), second(3);
  run_local_ranks(3, [&](int rank) {
    const auto store = comm::world_store();
    auto a = c10::make_intrusive<c10d::PrefixStore>("nccl-test/a", store);
    auto b = c10::make_intrusive<c10d::PrefixStore>("nccl-test/b", store);
    first[static_cast<std::size_t>(rank)] =
        comm::nccl_share_unique_id(*a, rank, std::chrono::seconds(30));
    second[static_cast<std::size_t>(rank)] =
        comm::nccl_share_unique_id(*b, rank, std::chrono::seconds(30));
  });
  EXPECT_EQ(first[0].size(), sizeof(ncclUniqueId));
  EXPECT_EQ(first[1], first[0]);
  EXPECT_EQ(first[2], first[0]);
  EXPECT_EQ(second[1], second[0]);
  EXPECT_EQ(second[2], second[0]);
  EXPECT_NE(first[0], second[0]);
}

// ---- on a GPU (scripts/gpu-check.sh): skipped where LibTorch has no CUDA or sees no GPU ----

std::unique_ptr<comm::Backend> one_rank_nccl(const std::string& key) {
  comm::BackendSetup setup;
  setup.store = c10::make_intrusive<c10d::HashStore>();
  setup.key = key;
  setup.ranks = {0};
  setup.timeout = std::chrono::seconds(60);
  setup.device = c10::Device(c10::kCUDA, 0);
  return comm::make_nccl_backend(setup);
}

// Every primitive (send/recv to itself included) and every dtype NCCL takes, on one-rank communicators; two of them at once on
// one GPU (a one-rank communicator's collectives are copies, so the results are the inputs).
TEST(NcclGpu, EveryCollectiveAndDtypeOnTwoOneRankCommunicators) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA tensors here (LibTorch without CUDA, or no GPU)";
  auto a = one_rank_nccl("a");
  auto b = one_rank_nccl("b");
  const at::Device gpu(at::kCUDA, 0);
  for (comm::Backend* backend : {a.get(), b.get()}) {
    EXPECT_TRUE(backend->moves(gpu));
    EXPECT_FALSE(backend->moves(at::Device(at::kCPU)));
    for (at::ScalarType dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kInt,
                                 at::kLong, at::kChar, at::kByte}) {
      const at::Tensor t = at::arange(12).to(gpu, dtype);
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        at::Tensor r = t.clone();
        EXPECT_STREQ(backend->all_reduce(r, op), "ncclAllReduce");
        EXPECT_TRUE(at::equal(r, t)) << dtype << " " << to_string(op);
      }
      at::Tensor gathered = at::empty_like(t).view(at::kByte);
      EXPECT_STREQ(backend->all_gather(t.view(at::kByte), gathered), "ncclAllGather");
      EXPECT_TRUE(at::equal(gathered.view(dtype), t)) << dtype;
      at::Tensor scattered = at::empty_like(t);
      EXPECT_STREQ(backend->reduce_scatter(t, scattered, ReduceOp::kSum), "ncclReduceScatter");
      EXPECT_TRUE(at::equal(scattered, t)) << dtype;
      at::Tensor exchanged = at::empty_like(t).view(at::kByte);
      const std::vector<int64_t> sizes{t.numel() * static_cast<int64_t>(t.element_size())};
      EXPECT_STREQ(backend->all_to_all(t.view(at::kByte), exchanged, sizes, sizes),
                   "ncclSend/ncclRecv");
      EXPECT_TRUE(at::equal(exchanged.view(dtype), t)) << dtype;
      at::Tensor passed = at::empty_like(t);
      EXPECT_STREQ(backend->send_recv(t, 0, passed, 0, 1), "ncclSend/ncclRecv");
      EXPECT_TRUE(at::equal(passed, t)) << dtype;
    }
    at::Tensor f = at::full({4}, 3.0, at::TensorOptions().device(gpu));
    backend->all_reduce(f, ReduceOp::kAvg);
    EXPECT_TRUE(at::equal(f.cpu(), at::full({4}, 3.0)));
    backend->barrier();
  }
  std::cout << "nccl: 5 primitives x 8 dtypes on two one-rank communicators of cuda:0 ok"
            << std::endl;
}

// Two thread ranks whose CUDA tensors sit on one GPU: NCCL would refuse the communicator; the
// ranks stop with a sentence that says so.
TEST(NcclGpu, TwoRanksOnOneGpuAreRefusedWithAReason) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA tensors here (LibTorch without CUDA, or no GPU)";
  DistributedOptions options;
  options.timeout = std::chrono::seconds(30);
  std::vector<std::string> errors(2);
  run_local_ranks(
      2,
      [&](int rank) {
        DeviceMesh mesh({2}, {"x"});
        const at::Tensor local = at::full({4}, rank + 1.0).to(at::Device(at::kCUDA, 0));
        try {
          DTensor::from_local(local, mesh, {Partial{}}).full_tensor();
        } catch (const Error& e) {
          errors[static_cast<std::size_t>(rank)] = e.what();
        }
      },
      options);
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("NCCL refuses two ranks of one communicator on one GPU"), std::string::npos)
        << e;
  }
  std::cout << "two ranks on one GPU: " << errors[0] << std::endl;
}

#endif  // TE_WITH_NCCL

}  // namespace
}  // namespace te
