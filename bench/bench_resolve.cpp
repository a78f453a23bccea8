// How much a with_sharding_constraint's rule resolution costs, relative to plain LibTorch work a
// module does anyway. Run: build/bench/bench_resolve
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include "te/sharding.h"

namespace {

const te::LogicalAxes kAxes = {"batch", "seqlen", "heads", std::nullopt};

void BM_ResolveUserRules(benchmark::State& state) {
  te::MeshResourceScope resource(te::parse_mesh_resource("dp=data,tp=model"));
  te::AxisRulesScope rules(te::extend_logical_axis_rules(te::parse_axis_rules("embed=model")));
  for (auto _ : state) benchmark::DoNotOptimize(te::resolve_logical_axes(kAxes));
}
BENCHMARK(BM_ResolveUserRules);

void BM_ResolveTeTable(benchmark::State& state) {
  te::set_warning_handler([](std::string_view) {});
  te::MeshResourceScope resource(te::parse_mesh_resource("dp=data,tp=model"));
  for (auto _ : state) benchmark::DoNotOptimize(te::resolve_logical_axes(kAxes));
  te::set_warning_handler(nullptr);
}
BENCHMARK(BM_ResolveTeTable);

void BM_ResolveNoContext(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(te::resolve_logical_axes(kAxes));
}
BENCHMARK(BM_ResolveNoContext);

// Plain LibTorch reference: the reshape a multi-head attention does on every forward.
void BM_LibTorchView(benchmark::State& state) {
  at::Tensor x = at::zeros({64, 32, 256});
  for (auto _ : state) benchmark::DoNotOptimize(x.view({64, 32, 8, 32}));
}
BENCHMARK(BM_LibTorchView);

}  // namespace

BENCHMARK_MAIN();
