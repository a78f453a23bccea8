// Layout-invariant dropout (te::nn::functional::dropout: Philox 4x32-10 keyed by the global
// element index) against LibTorch's at::dropout on the same tensor, one process. The two are
// alternated within each measured iteration block so both see the same machine state; the
// figure to read is ratio_vs_at_dropout (te time / at::dropout time).

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <chrono>
#include <functional>
#include <vector>

#include "alternate.h"
#include "te/nn/random.h"

namespace {

double seconds_of(const std::function<void()>& fn, int reps) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / reps;
}

// Forward (and, with backward, the gradient) of dropout p = 0.1 on [rows, 1024] fp32.
void Dropout(benchmark::State& state) {
  const int64_t rows = state.range(0);
  const bool backward = state.range(1) != 0;
  const at::Tensor base = at::randn({rows, 1024});
  auto run = [&](bool te_version) {
    at::Tensor x = backward ? base.clone().requires_grad_(true) : base;
    at::Tensor y =
        te_version ? te::nn::functional::dropout(x, 0.1, true) : at::dropout(x, 0.1, true);
    if (backward) y.backward(at::ones_like(y));
    benchmark::DoNotOptimize(y.data_ptr());
  };
  te::bench::alternate(
      state, [&] { return seconds_of([&] { run(true); }, 3); },
      [&] { return seconds_of([&] { run(false); }, 3); }, "at_dropout");
  state.SetItemsProcessed(state.iterations() * 3 * rows * 1024);
}
BENCHMARK(Dropout)
    ->ArgsProduct({{64, 2048}, {0, 1}})
    ->ArgNames({"rows", "backward"})
    ->Iterations(15)
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) { return te::bench::run_benchmarks(argc, argv); }
