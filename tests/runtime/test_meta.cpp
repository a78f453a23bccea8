// Shapes without data: the meta kernels te-cpp adds, the counting allocator, and a simulated world.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <thread>

#include "../expect_error.h"
#include "te/distributed.h"
#include "te/runtime/meta.h"

namespace te {
namespace {

at::Tensor meta(std::vector<int64_t> sizes, at::ScalarType dtype = at::kFloat) {
  return at::empty(sizes, at::TensorOptions().device(at::kMeta).dtype(dtype));
}

TEST(MetaKernels, TheOperatorsTheModulesCallRunOnMetaTensors) {
  ensure_meta_kernels();
  const at::Tensor x = meta({2, 3, 8}, at::kBFloat16);
  const auto [y, mean, rstd] = at::native_layer_norm(x, {8}, meta({8}), meta({8}), 1e-5);
  EXPECT_EQ(y.sizes(), x.sizes());
  EXPECT_EQ(mean.sizes(), (std::vector<int64_t>{2, 3, 1}));
  EXPECT_EQ(mean.scalar_type(), at::kFloat);  // statistics of bf16 kept in fp32, as on the CPU
  EXPECT_EQ(at::where(meta({3, 1}, at::kBool), meta({1, 4}), meta({3, 4}, at::kDouble)).sizes(),
            (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(at::where(meta({1}, at::kBool), meta({2}), meta({2}, at::kDouble)).scalar_type(),
            at::kDouble);
  EXPECT_EQ(at::abs(x).sizes(), x.sizes());
  EXPECT_EQ(x.max().dim(), 0);
  EXPECT_EQ(x.index_select(1, meta({5}, at::kLong)).sizes(), (std::vector<int64_t>{2, 5, 8}));
  EXPECT_EQ(at::roll(x, {1}, {0}).sizes(), x.sizes());
  EXPECT_TRUE(at::relu(x).is_meta());
  const at::Tensor table_grad =
      at::embedding_dense_backward(x, meta({2, 3}, at::kLong), 11, -1, false);
  EXPECT_EQ(table_grad.sizes(), (std::vector<int64_t>{11, 8}));
  EXPECT_EQ(table_grad.scalar_type(), at::kBFloat16);
  ensure_meta_kernels();  // idempotent
}

TEST(AllocationCounter, CountsLiveAndPeakBytesOfThisThread) {
  AllocationCounter counter(c10::DeviceType::CPU);
  at::Tensor a = at::empty({1024}, at::kFloat);
  EXPECT_EQ(counter.live_bytes(), 4096);
  {
    at::Tensor b = at::empty({2048}, at::kFloat);
    EXPECT_EQ(counter.live_bytes(), 4096 + 8192);
  }
  EXPECT_EQ(counter.live_bytes(), 4096);
  EXPECT_EQ(counter.peak_bytes(), 4096 + 8192);
  counter.reset_peak();
  EXPECT_EQ(counter.peak_bytes(), 4096);
  // Another thread's allocations are its own; a tensor freed there is uncounted here.
  std::thread([&] {
    at::Tensor c = at::empty({4096}, at::kFloat);
    a = at::Tensor();
  }).join();
  EXPECT_EQ(counter.live_bytes(), 0);
}

TEST(AllocationCounter, NestsAndCountsMetaTensorsWithoutMemory) {
  AllocationCounter outer(c10::DeviceType::Meta);
  at::Tensor x = meta({256});
  AllocationCounter inner(c10::DeviceType::Meta);
  at::Tensor y = x * 2;
  EXPECT_EQ(outer.live_bytes(), 2048);
  EXPECT_EQ(inner.live_bytes(), 1024);
  EXPECT_ERROR(AllocationCounter(c10::DeviceType::CUDA), "counts CPU or meta allocations");
}

TEST(SimulatedWorld, CollectivesActAsIfEveryRankHeldThisRanksTensor) {
  run_simulated_rank(1024, 5, [] {
    EXPECT_EQ(world_size(), 1024);
    EXPECT_EQ(world_rank(), 5);
    DeviceMesh mesh({64, 16}, {"data", "model"});
    EXPECT_EQ(mesh.rank(), 5);
    CommTrace trace;
    // Rank 5 holds row 5 of its 16-way "model" row: a gather of 16 copies of its piece.
    const at::Tensor piece = at::full({2}, 5.0);
    DTensor d = DTensor::from_local(piece, mesh, {Replicate{}, Shard{0}}, std::vector<int64_t>{32});
    EXPECT_TRUE(at::equal(d.full_tensor(), at::full({32}, 5.0)));
    EXPECT_EQ(trace.count(Collective::kAllGather, "model"), 1);
    EXPECT_EQ(trace.bytes(Collective::kAllGather, "model"), 32 * 4);
    // A sum over 64 data-parallel copies.
    EXPECT_TRUE(
        at::equal(mesh.all_reduce(at::ones({3}), ReduceOp::kSum, {0}), at::full({3}, 64.0)));
  });
  EXPECT_EQ(world_size(), 1);  // the thread's world is back
  EXPECT_ERROR(run_simulated_rank(4, 4, [] {}), "rank 4 of 4 ranks");
}

}  // namespace
}  // namespace te
