// Layout-invariant dropout (te::nn::functional::dropout: Philox 4x32-10 keyed by the global
// element index) against LibTorch's at::dropout on the same tensor, one process. The two are
// alternated within each measured iteration block so both see the same machine state; the
// figure to read is ratio_vs_at_dropout (te time / at::dropout time).

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "te/nn/random.h"
#include "te/runtime.h"

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
  for (int i = 0; i < 3; ++i) {
    run(true);
    run(false);
  }
  std::vector<double> te_s, at_s;
  for (auto _ : state) {
    te_s.push_back(seconds_of([&] { run(true); }, 3));
    at_s.push_back(seconds_of([&] { run(false); }, 3));
  }
  std::sort(te_s.begin(), te_s.end());
  std::sort(at_s.begin(), at_s.end());
  const double te_med = te_s[te_s.size() / 2], at_med = at_s[at_s.size() / 2];
  state.counters["te_ms"] = te_med * 1e3;
  state.counters["at_dropout_ms"] = at_med * 1e3;
  state.counters["ratio_vs_at_dropout"] = te_med / at_med;
  state.SetItemsProcessed(state.iterations() * 3 * rows * 1024);
}
BENCHMARK(Dropout)
    ->ArgsProduct({{64, 2048}, {0, 1}})
    ->ArgNames({"rows", "backward"})
    ->Iterations(15)
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  te::configure_threads();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
