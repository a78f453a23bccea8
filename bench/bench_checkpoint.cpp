// Saving and loading a 200 MB model (a LayerNormMLP of 2048 x 12288, tensor parallel over 2 thread
// ranks, each writing its 100 MB half) against a plain `cp -r` of the same checkpoint files plus
// `sync` (and `cat` of them), alternated with it on the same disk. Every byte is written once by
// its owner and read once by the rank that needs it. The figures to read: save_vs_cp, load_vs_cp
// and load_vs_cat (checkpoint bandwidth / plain tool bandwidth, medians of 5; 1.0 = as fast).

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "te/nn.h"
#include "te/runtime.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double shell_seconds(const std::string& command) {
  const auto start = Clock::now();
  if (std::system(command.c_str()) != 0) return -1;
  return seconds_since(start);
}

void SaveAndLoad200MB(benchmark::State& state) {
  const fs::path root = fs::temp_directory_path() / "te_bench_checkpoint";
  fs::remove_all(root);
  fs::create_directories(root);
  const std::string dir = (root / "ckpt").string();
  std::vector<double> save_s, load_s, cp_s, cat_s;
  int64_t bytes = 0;
  te::set_warning_handler([](std::string_view) {});
  for (auto _ : state) {
    double save = 0, load = 0;
    te::run_local_ranks(2, [&](int rank) {
      te::DeviceMesh mesh({2}, {"tp"});
      te::MeshScope on_mesh(mesh);
      te::MeshResourceScope roles(te::parse_mesh_resource("tp=tp"));
      te::nn::manual_seed(1);
      te::nn::LayerNormMLP mlp(te::nn::LayerNormMLPOptions(2048, 12288));
      auto start = Clock::now();
      te::nn::save_checkpoint(*mlp, dir);
      if (rank == 0) save = seconds_since(start);
      te::nn::LayerNormMLP loaded(te::nn::LayerNormMLPOptions(2048, 12288));
      start = Clock::now();
      te::nn::load_checkpoint(*loaded, dir);
      if (rank == 0) load = seconds_since(start);
    });
    save_s.push_back(save);
    load_s.push_back(load);
    bytes = 0;
    for (const auto& f : fs::directory_iterator(dir)) bytes += fs::file_size(f.path());
    // The same bytes by the plain tools, under the same conditions as the save (replacing the
    // previous copy, the data on disk afterwards), alternated with it.
    cp_s.push_back(
        shell_seconds("rm -rf " + dir + ".copy && cp -r " + dir + " " + dir + ".copy && sync"));
    cat_s.push_back(shell_seconds("cat " + dir + "/* > /dev/null"));
    state.SetIterationTime(save);
  }
  fs::remove_all(root);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double mb = bytes / 1e6;
  state.counters["MB"] = mb;
  state.counters["save_MBps"] = mb / median(save_s);
  state.counters["load_MBps"] = mb / median(load_s);
  state.counters["cp_MBps"] = mb / median(cp_s);
  state.counters["cat_MBps"] = mb / median(cat_s);
  state.counters["save_vs_cp"] = median(cp_s) / median(save_s);
  state.counters["load_vs_cp"] = median(cp_s) / median(load_s);
  state.counters["load_vs_cat"] = median(cat_s) / median(load_s);
}
BENCHMARK(SaveAndLoad200MB)->Iterations(5)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  te::configure_threads();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
