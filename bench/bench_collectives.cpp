// Cost of each DTensor transition on Gloo, per c10d primitive that can carry it, next to the
// plain c10d call a LibTorch user would make. Picks the defaults in DistributedOptions.
//
//   build/tools/te-run --nproc 2 -- build/bench/bench_collectives
//   build/tools/te-run --nproc 4 -- build/bench/bench_collectives --benchmark_filter=16MB
//
// Every rank runs the same benchmarks with a fixed iteration count (collectives must line up);
// rank 0 reports. Bytes are those of the whole tensor; time is per transition.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <map>
#include <string>

#include "te/distributed.h"
#include "te/runtime.h"

namespace {

constexpr int kIterations = 5;

// One mesh per choice of primitives, created in the same order on every rank.
te::DeviceMesh& mesh(te::GatherAlgorithm gather = te::GatherAlgorithm::kPaddedAllReduce,
                     te::ReduceScatterAlgorithm rs = te::ReduceScatterAlgorithm::kAllReduceSlice) {
  static std::map<std::pair<int, int>, te::DeviceMesh> meshes = [] {
    std::map<std::pair<int, int>, te::DeviceMesh> m;
    for (auto g : {te::GatherAlgorithm::kPaddedAllReduce, te::GatherAlgorithm::kAllGather,
                   te::GatherAlgorithm::kAllToAll}) {
      for (auto r : {te::ReduceScatterAlgorithm::kAllReduceSlice,
                     te::ReduceScatterAlgorithm::kAllToAllSum}) {
        m.emplace(std::make_pair(static_cast<int>(g), static_cast<int>(r)),
                  te::DeviceMesh({te::world_size()}, {"x"}, te::CollectiveAlgorithms{g, r}));
      }
    }
    return m;
  }();
  return meshes.at({static_cast<int>(gather), static_cast<int>(rs)});
}

// Plain LibTorch: a Gloo group of its own over the same rendezvous, used the way a LibTorch user
// would for the same movement.
c10d::ProcessGroupGloo& plain_group() {
  static c10::intrusive_ptr<c10d::ProcessGroupGloo> pg = [] {
    c10d::TCPStoreOptions o;
    o.port = static_cast<std::uint16_t>(std::atoi(std::getenv("MASTER_PORT")));
    o.isServer = false;
    auto store = c10::make_intrusive<c10d::TCPStore>(std::getenv("MASTER_ADDR"), o);
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    return c10::make_intrusive<c10d::ProcessGroupGloo>(
        c10::make_intrusive<c10d::PrefixStore>("bench-plain", store), te::world_rank(),
        te::world_size(), opts);
  }();
  return *pg;
}

// A [rows, 256] float tensor of `megabytes` in all.
at::Tensor global_of(int64_t megabytes) {
  return at::ones({megabytes * 1024 * 1024 / 4 / 256, 256});
}

void set_bytes(benchmark::State& state, int64_t megabytes) {
  state.SetBytesProcessed(state.iterations() * megabytes * 1024 * 1024);
}

void BM_ShardToReplicate(benchmark::State& state, te::GatherAlgorithm algo) {
  const int64_t mb = state.range(0);
  te::DTensor x = te::DTensor::distribute(global_of(mb), mesh(algo), {te::Shard{0}});
  for (auto _ : state) benchmark::DoNotOptimize(x.redistribute({te::Replicate{}}));
  set_bytes(state, mb);
}

void BM_PartialToShard(benchmark::State& state, te::ReduceScatterAlgorithm algo) {
  const int64_t mb = state.range(0);
  te::DTensor x = te::DTensor::from_local(
      global_of(mb), mesh(te::GatherAlgorithm::kPaddedAllReduce, algo), {te::Partial{}});
  for (auto _ : state) benchmark::DoNotOptimize(x.redistribute({te::Shard{0}}));
  set_bytes(state, mb);
}

void BM_PartialToReplicate(benchmark::State& state) {
  const int64_t mb = state.range(0);
  te::DTensor x = te::DTensor::from_local(global_of(mb), mesh(), {te::Partial{}});
  for (auto _ : state) benchmark::DoNotOptimize(x.redistribute({te::Replicate{}}));
  set_bytes(state, mb);
}

void BM_ShardToShard(benchmark::State& state) {
  const int64_t mb = state.range(0);
  te::DTensor x = te::DTensor::distribute(global_of(mb), mesh(), {te::Shard{0}});
  for (auto _ : state) benchmark::DoNotOptimize(x.redistribute({te::Shard{1}}));
  set_bytes(state, mb);
}

void BM_PlainC10dAllgather(benchmark::State& state) {
  const int64_t mb = state.range(0);
  at::Tensor local = te::DTensor::distribute(global_of(mb), mesh(), {te::Shard{0}}).to_local();
  for (auto _ : state) {
    std::vector<at::Tensor> in{local};
    std::vector<std::vector<at::Tensor>> out(1);
    for (int i = 0; i < te::world_size(); ++i) out[0].push_back(at::empty_like(local));
    plain_group().allgather(out, in)->wait();
    benchmark::DoNotOptimize(at::cat(out[0]));
  }
  set_bytes(state, mb);
}

void BM_PlainC10dAllreduce(benchmark::State& state) {
  const int64_t mb = state.range(0);
  at::Tensor full = global_of(mb);
  for (auto _ : state) {
    std::vector<at::Tensor> t{full.clone()};
    plain_group().allreduce(t)->wait();
    benchmark::DoNotOptimize(t[0]);
  }
  set_bytes(state, mb);
}

void sizes(benchmark::internal::Benchmark* b) {
  b->ArgName("MB")
      ->Arg(1)
      ->Arg(16)
      ->Arg(64)
      ->Iterations(kIterations)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(BM_ShardToReplicate, padded_allreduce, te::GatherAlgorithm::kPaddedAllReduce)
    ->Apply(sizes);
BENCHMARK_CAPTURE(BM_ShardToReplicate, allgather, te::GatherAlgorithm::kAllGather)->Apply(sizes);
BENCHMARK_CAPTURE(BM_ShardToReplicate, alltoall, te::GatherAlgorithm::kAllToAll)->Apply(sizes);
BENCHMARK(BM_PlainC10dAllgather)->Apply(sizes);
BENCHMARK(BM_PartialToReplicate)->Apply(sizes);
BENCHMARK(BM_PlainC10dAllreduce)->Apply(sizes);
BENCHMARK_CAPTURE(BM_PartialToShard, allreduce_slice, te::ReduceScatterAlgorithm::kAllReduceSlice)
    ->Apply(sizes);
BENCHMARK_CAPTURE(BM_PartialToShard, alltoall_sum, te::ReduceScatterAlgorithm::kAllToAllSum)
    ->Apply(sizes);
BENCHMARK(BM_ShardToShard)->Apply(sizes);

class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace

int main(int argc, char** argv) {
  te::init_distributed();
  te::configure_threads();
  benchmark::Initialize(&argc, argv);
  mesh();
  plain_group();
  // Warm up every group (Gloo connects and caches algorithms on first use).
  for (auto g : {te::GatherAlgorithm::kPaddedAllReduce, te::GatherAlgorithm::kAllGather,
                 te::GatherAlgorithm::kAllToAll}) {
    for (auto r :
         {te::ReduceScatterAlgorithm::kAllReduceSlice, te::ReduceScatterAlgorithm::kAllToAllSum}) {
      te::DTensor x = te::DTensor::from_local(global_of(1), mesh(g, r), {te::Partial{}});
      x.redistribute({te::Shard{0}}).redistribute({te::Shard{1}}).full_tensor();
    }
  }
  std::vector<at::Tensor> warm{global_of(1)};
  plain_group().allreduce(warm)->wait();
  if (te::world_rank() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    NullReporter quiet;
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  te::shutdown_distributed();
  return 0;
}
