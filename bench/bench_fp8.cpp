// CPU FP8 quantize throughput as a fraction of memcpy bandwidth on the same buffer (issue: goal
// >= 0.5). Bytes are the fp32 input's. Run: build/bench/bench_fp8
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "te/kernels/fp8_cast.h"

namespace {

std::vector<float> data(int64_t n) {
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(0.0f, 50.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

void BM_Memcpy(benchmark::State& state) {
  const auto in = data(state.range(0));
  std::vector<float> out(in.size());
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), in.size() * sizeof(float));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * 4);
}

void BM_Quantize(benchmark::State& state, te::fp8::DType type) {
  const auto in = data(state.range(0));
  std::vector<uint8_t> out(in.size());
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        te::fp8::quantize(in.data(), out.data(), state.range(0), 2.0f, type));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * 4);
}

void BM_Dequantize(benchmark::State& state) {
  std::vector<uint8_t> in(static_cast<std::size_t>(state.range(0)), 0x38);
  std::vector<float> out(in.size());
  for (auto _ : state) {
    te::fp8::dequantize(in.data(), out.data(), state.range(0), 0.5f, te::fp8::DType::kE4M3);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * 4);
}

BENCHMARK(BM_Memcpy)->Arg(1 << 24);
BENCHMARK_CAPTURE(BM_Quantize, e4m3, te::fp8::DType::kE4M3)->Arg(1 << 24);
BENCHMARK_CAPTURE(BM_Quantize, e5m2, te::fp8::DType::kE5M2)->Arg(1 << 24);
BENCHMARK(BM_Dequantize)->Arg(1 << 24);

}  // namespace

BENCHMARK_MAIN();
