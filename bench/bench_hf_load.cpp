// Loading a GGUF model (SmolLM2-135M-Instruct Q4_1 by default, as tests/interop/check_smollm2.py
// caches it; another file with TE_BENCH_GGUF=PATH) with te::hf::load_causal_lm onto one process,
// against `cp` of the same file (into the system's temporary folder), alternated
// (bench/alternate.h): as it loads by default, its quantized weights held in their blocks mapped
// from the file (LoadGguf), and dequantized to float32 (LoadGgufFloat32, LoadOptions::
// dequantize_gguf). Also the bytes each rank reads when three tensor-parallel thread ranks load it
// (SmolLM2's 9 heads split over 3), as a fraction of the file; and the floor of any load that
// holds the weights in float32: allocating and writing once the bytes of the float32 model's
// parameters (TouchFp32Weights, against the same cp). The figures to read: ratio_vs_cp of each,
// resident_MB (te::nn::resident_bytes of the loaded model) and tp3_max_rank_fraction.

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
#include "te/nn/inference.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string model_path() {
  if (const char* p = std::getenv("TE_BENCH_GGUF")) return p;
  // Where scripts/fetch-models.sh puts it.
  if (const char* cache = std::getenv("TE_MODEL_CACHE")) {
    return std::string(cache) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  }
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/te-cpp/models/SmolLM2-135M-Instruct.Q4_1.gguf";
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

bool have_model(benchmark::State& state, const std::string& path) {
  if (fs::exists(path)) return true;
  state.SkipWithError(
      ("no " + path + " (run tests/interop/check_smollm2.py once, or set TE_BENCH_GGUF)").c_str());
  return false;
}

// One load's time against cp's, alternated, and the loaded model's resident bytes.
void load_against_cp(benchmark::State& state, const std::string& path,
                     const te::hf::LoadOptions& options) {
  int64_t resident = 0;
  te::bench::alternate(
      state,
      [&] {
        return seconds([&] {
          resident = te::nn::resident_bytes(*te::hf::load_causal_lm(path, options));
        });
      },
      [&] { return cp_seconds(path); }, "cp", 1);
  state.counters["file_MB"] = static_cast<double>(fs::file_size(path)) / 1e6;
  state.counters["resident_MB"] = static_cast<double>(resident) / 1e6;
}

void LoadGguf(benchmark::State& state) {
  const std::string path = model_path();
  if (!have_model(state, path)) return;
  const double file_mb = static_cast<double>(fs::file_size(path)) / 1e6;
  load_against_cp(state, path, {});
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
  state.counters["tp3_max_rank_fraction"] = static_cast<double>(most) / 1e6 / file_mb;
}
BENCHMARK(LoadGguf)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);

void LoadGgufFloat32(benchmark::State& state) {
  const std::string path = model_path();
  if (!have_model(state, path)) return;
  te::hf::LoadOptions o;
  o.dequantize_gguf = true;
  load_against_cp(state, path, o);
}
BENCHMARK(LoadGgufFloat32)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);

// The floor of a float32 load: fresh memory for the loaded model's parameters, written once.
void TouchFp32Weights(benchmark::State& state) {
  const std::string path = model_path();
  if (!have_model(state, path)) return;
  te::hf::LoadOptions o;
  o.dequantize_gguf = true;
  int64_t elements = 0;
  for (const auto& p : te::hf::load_causal_lm(path, o)->parameters()) elements += p.numel();
  te::bench::alternate(
      state, [&] { return seconds([&] { at::empty({elements}, at::kFloat).fill_(1.0f); }); },
      [&] { return cp_seconds(path); }, "cp", 1);
  state.counters["fp32_MB"] = static_cast<double>(elements) * 4 / 1e6;
}
BENCHMARK(TouchFp32Weights)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) { return te::bench::run_benchmarks(argc, argv); }
