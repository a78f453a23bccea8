// Embedding te::nn in a server, in one file (docs/embedding.md walks through it):
//   1. at start, load a checkpoint (written on any mesh) into a model built on one process;
//   2. hold its GEMM kernels in FP8 (optional);
//   3. share the one model between worker threads, each carrying the application's sharding
//      context and running under c10::InferenceMode;
// and check that every request gets what the same call made alone gets.

#include <c10/core/InferenceMode.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "te/nn.h"

namespace {

te::nn::TransformerLayerOptions layer_options() {
  return te::nn::TransformerLayerOptions(64, 256, 4).layer_type("encoder");
}

// Stands in for a training job: a model whose FP8 input scales are calibrated, saved.
void write_checkpoint(const std::string& dir) {
  te::nn::manual_seed(0);
  te::nn::TransformerLayer model(layer_options());
  model->eval();
  {
    c10::InferenceMode inference;
    te::Fp8Autocast calibrate(/*enabled=*/false, te::fp8::DelayedScaling{}, std::nullopt,
                              /*calibrating=*/true);
    for (int i = 0; i < 4; ++i) model(at::randn({8, 16, 64}));
  }
  te::nn::save_checkpoint(*model, dir, R"({"model": "demo"})");
}

}  // namespace

int main() {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("te-embedding-" + std::to_string(::getpid())))
          .string();
  write_checkpoint(dir);

  // The application's rules, set once on the main thread.
  te::AxisRulesScope rules({{"batch", {"data"}}, {"heads", {"model"}}});

  // 1. Load on one process: build the model with the checkpoint's options, then load.
  te::nn::TransformerLayer model(layer_options());
  te::nn::CheckpointLoadOptions load;
  load.restore_rng_state = false;  // a server draws no dropout
  te::nn::load_checkpoint(*model, dir, load);
  std::filesystem::remove_all(dir);
  model->eval();

  // 2. FP8 weights: E4M3 codes and a scale per kernel, the fp32 kernels released.
  const int64_t frozen = te::nn::freeze_fp8_weights(*model);

  // 3. Requests on worker threads: each carries the rules captured here, under InferenceMode.
  constexpr int kThreads = 8, kRequests = 4;
  std::vector<at::Tensor> requests, alone, shared(kThreads * kRequests);
  for (int i = 0; i < kThreads * kRequests; ++i) requests.push_back(at::randn({2, 16, 64}));
  {
    c10::InferenceMode inference;
    for (const auto& x : requests) alone.push_back(model(x));
  }
  std::vector<std::string> seen(kThreads);
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back(te::bind_sharding_context([&, t] {
      c10::InferenceMode inference;
      for (int r = 0; r < kRequests; ++r) {
        const int i = t * kRequests + r;
        shared[i] = model(requests[i]);
      }
      seen[t] = te::to_string(*te::resolve_logical_axes({"batch", std::nullopt, "heads"}));
    }));
  }
  for (auto& w : workers) w.join();

  int same = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) same += at::equal(shared[i], alone[i]);
  std::printf(
      "embedding: %d FP8 kernels; %d of %zu requests on %d threads equal the calls made "
      "alone; worker rules: %s\n",
      static_cast<int>(frozen), same, requests.size(), kThreads, seen[0].c_str());
  return same == static_cast<int>(requests.size()) ? 0 : 1;
}
