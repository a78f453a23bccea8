// Saving and loading a 200 MB model (a LayerNormMLP of 2048 x 12288, tensor parallel over 2 thread
// ranks, each writing its 100 MB half) against a plain `cp -r` of the same checkpoint files plus
// `sync`, on the same disk in the same run. Every byte is written once by its owner and read
// once by the rank that needs it. The figures to read: save_vs_cp and load_vs_cat (checkpoint
// bandwidth / plain tool bandwidth; 1.0 = as fast as cp / cat).

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

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
  double save_s = 0, load_s = 0;
  int64_t bytes = 0;
  te::set_warning_handler([](std::string_view) {});
  for (auto _ : state) {
    te::run_local_ranks(2, [&](int rank) {
      te::DeviceMesh mesh({2}, {"tp"});
      te::MeshScope on_mesh(mesh);
      te::MeshResourceScope roles(te::parse_mesh_resource("tp=tp"));
      te::nn::manual_seed(1);
      te::nn::LayerNormMLP mlp(te::nn::LayerNormMLPOptions(2048, 12288));
      auto start = Clock::now();
      te::nn::save_checkpoint(*mlp, dir);
      if (rank == 0) save_s = seconds_since(start);
      te::nn::LayerNormMLP loaded(te::nn::LayerNormMLPOptions(2048, 12288));
      start = Clock::now();
      te::nn::load_checkpoint(*loaded, dir);
      if (rank == 0) load_s = seconds_since(start);
    });
    bytes = 0;
    for (const auto& f : fs::directory_iterator(dir)) bytes += fs::file_size(f.path());
    state.SetIterationTime(save_s);
  }
  // cp with the data on disk afterwards (save_checkpoint fsyncs every file it writes).
  const double cp_s = shell_seconds("cp -r " + dir + " " + dir + ".copy && sync");
  const double cat_s = shell_seconds("cat " + dir + "/* > /dev/null");
  fs::remove_all(root);
  state.counters["MB"] = bytes / 1e6;
  state.counters["save_MBps"] = bytes / 1e6 / save_s;
  state.counters["load_MBps"] = bytes / 1e6 / load_s;
  state.counters["cp_MBps"] = bytes / 1e6 / cp_s;
  state.counters["cat_MBps"] = bytes / 1e6 / cat_s;
  state.counters["save_vs_cp"] = cp_s / save_s;
  state.counters["load_vs_cat"] = cat_s / load_s;
}
BENCHMARK(SaveAndLoad200MB)->Iterations(2)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  te::configure_threads();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
