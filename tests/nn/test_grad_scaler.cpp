// te::optim::GradScaler: torch.amp.GradScaler's scales and skipped steps, and on a mesh every rank
// skipping the step one rank's shard overflows in.

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <limits>

#include "../distributed/dist_test_util.h"
#include "../expect_error.h"
#include "te/nn.h"
#include "te/optim/grad_scaler.h"

namespace te::optim {
namespace {

// Known answers of PyTorch 2.11's torch.amp.GradScaler("cpu", init_scale=8.0,
// growth_interval=2) over p = ones(3), SGD lr 0.1, loss sum(p * p), the scaled loss times inf at
// step 2: the scale and growth tracker after each update(), and p.
TEST(GradScaler, StepsAndScalesAsTorchAmpGradScaler) {
  auto m = std::make_shared<torch::nn::Module>();
  at::Tensor p = m->register_parameter("p", at::ones({3}));
  torch::optim::SGD sgd(m->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler(GradScalerOptions().init_scale(8.0).growth_interval(2));
  const bool overflow[] = {false, false, true, false, false, false};
  const double scales[] = {8, 16, 8, 8, 16, 16};
  const int64_t trackers[] = {1, 0, 0, 1, 0, 1};
  const float values[] = {0.8f, 0.64f, 0.64f, 0.512f, 0.4096f, 0.32768f};
  for (int step = 0; step < 6; ++step) {
    sgd.zero_grad();
    at::Tensor loss = scaler.scale((p * p).sum());
    if (overflow[step]) loss = loss * std::numeric_limits<float>::infinity();
    loss.backward();
    EXPECT_EQ(scaler.step(sgd, *m), !overflow[step]) << step;
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), scales[step]) << step;
    EXPECT_EQ(scaler.growth_tracker(), trackers[step]) << step;
    EXPECT_NEAR(p[0].item<float>(), values[step], 1e-6) << step;
  }
  EXPECT_EQ(scaler.skipped_steps(), 1);
}

TEST(GradScaler, BadUseIsNamed) {
  EXPECT_ERROR(GradScaler(GradScalerOptions().init_scale(0)), "init_scale 0 is not positive");
  EXPECT_ERROR(GradScaler(GradScalerOptions().growth_factor(1)), "growth_factor 1 is not above 1");
  EXPECT_ERROR(GradScaler(GradScalerOptions().backoff_factor(1)), "backoff_factor 1 is not in");
  EXPECT_ERROR(GradScaler(GradScalerOptions().growth_interval(0)), "growth_interval 0 is not");
  GradScaler scaler;
  EXPECT_ERROR(scaler.update(), "GradScaler: update() without unscale() or step()");
}

// Tensor parallel: only rank 0's shard of the kernel overflows; both ranks skip, and the scale
// backs off on both.
TEST(GradScalerParallel, EveryRankSkipsWhenOneShardOverflows) {
  run_local_ranks(2, [](int rank) {
    DeviceMesh mesh({2}, {"tp"});
    MeshScope mesh_scope(mesh);
    MeshResourceScope resource(parse_mesh_resource("tp=tp"));
    te::nn::manual_seed(3);
    te::nn::Dense dense(te::nn::DenseOptions(8, 6).use_bias(false));
    torch::optim::SGD sgd(dense->parameters(), torch::optim::SGDOptions(0.1));
    GradScaler scaler(GradScalerOptions().init_scale(4.0));
    const DTensor x = DTensor::distribute(at::ones({2, 8}), mesh, {Replicate{}});
    scaler.scale(dense(x).full_tensor().sum()).backward();
    const at::Tensor before = dense->kernel.detach().clone();
    if (rank == 0)
      dense->kernel.mutable_grad().view(-1)[0] = std::numeric_limits<float>::infinity();
    EXPECT_FALSE(scaler.step(sgd, *dense)) << "rank " << rank;
    scaler.update();
    EXPECT_TRUE(at::equal(dense->kernel.detach(), before)) << "rank " << rank;
    EXPECT_EQ(scaler.get_scale(), 2.0) << "rank " << rank;
    EXPECT_EQ(scaler.skipped_steps(), 1);
  });
}

}  // namespace
}  // namespace te::optim
