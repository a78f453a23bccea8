#pragma once

// Side-by-side timing for the benchmarks that compare te-cpp with plain LibTorch: the two are
// alternated (after warm-up rounds), so both see the same machine state, and reported as medians
// and their ratio.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <string>
#include <vector>

#include "te/runtime.h"

namespace te::bench {

/// Runs `te_seconds()` and `plain_seconds()` (each returns the seconds one measurement took)
/// `warmup` times each (three by default) to warm up, then once each per benchmark iteration,
/// in turns (te first, then the other first). Reports te_ms,
/// <plain>_ms and ratio_vs_<plain> (te median / plain median); returns the te median.
template <typename Te, typename Plain>
double alternate(benchmark::State& state, Te te_seconds, Plain plain_seconds,
                 const std::string& plain, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) {
    te_seconds();
    plain_seconds();
  }
  std::vector<double> te, other;
  bool te_first = true;  // which goes first alternates too: neither always runs on a cold cache
  for (auto _ : state) {
    if (te_first) {
      te.push_back(te_seconds());
      other.push_back(plain_seconds());
    } else {
      other.push_back(plain_seconds());
      te.push_back(te_seconds());
    }
    te_first = !te_first;
  }
  std::sort(te.begin(), te.end());
  std::sort(other.begin(), other.end());
  const double te_med = te[te.size() / 2], other_med = other[other.size() / 2];
  state.counters["te_ms"] = te_med * 1e3;
  state.counters[plain + "_ms"] = other_med * 1e3;
  state.counters["ratio_vs_" + plain] = te_med / other_med;
  return te_med;
}

/// main(): LibTorch's threads as te-cpp programs set them, then Google Benchmark.
inline int run_benchmarks(int argc, char** argv) {
  te::configure_threads();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}

}  // namespace te::bench
