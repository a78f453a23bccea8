// CPU FP8: quantize throughput as a fraction of memcpy bandwidth on the same buffer (goal >= 0.5;
// bytes are the fp32 input's), and the reference FP8 GEMM against LibTorch's fp32 GEMM.
// Cast-transpose (both layouts in one cast) against memcpy too. Float8BlockScaling's casts
// against memcpy (goal >= 0.5) and its reference GEMM against fp32 at 2048^3 (goal <= 1.3).
// Run: build/bench/bench_fp8   (counters: fraction_of_memcpy, ratio_vs_fp32)
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "te/fp8.h"

namespace {

std::vector<float> data(int64_t n) {
  std::mt19937 gen(1);
  std::normal_distribution<float> dist(0.0f, 50.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

// Best-of time of fn over `reps` runs.
template <typename Fn>
double best_seconds(Fn&& fn, int reps) {
  double best = 1e9;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// Seconds per memcpy of n floats (best of 20), the yardstick of the quantize figures.
double memcpy_seconds(const std::vector<float>& in) {
  std::vector<float> out(in.size());
  return best_seconds(
      [&] {
        std::memcpy(out.data(), in.data(), in.size() * sizeof(float));
        benchmark::ClobberMemory();
      },
      20);
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
  const double copy = memcpy_seconds(in);
  double best = 1e9;
  for (auto _ : state) {
    best = std::min(best, best_seconds(
                              [&] {
                                benchmark::DoNotOptimize(te::fp8::quantize(
                                    in.data(), out.data(), state.range(0), 2.0f, type));
                                benchmark::ClobberMemory();
                              },
                              1));
  }
  state.SetBytesProcessed(state.iterations() * state.range(0) * 4);
  state.counters["fraction_of_memcpy"] = copy / best;  // best against best
  state.SetLabel(te::fp8::kernel_isa());
}

// One cast into both layouts (codes of x and of x^T, amax recorded) of a square fp32 matrix,
// against one memcpy of it: the cast reads x once and writes 2 bytes per element.
void BM_CastTranspose(benchmark::State& state) {
  const int64_t n = state.range(0);
  const auto values = data(n * n);
  const at::Tensor x = at::from_blob(const_cast<float*>(values.data()), {n, n}).clone();
  const at::Tensor scale = at::full({1}, 2.0f), amax = at::zeros({1});
  const double copy = memcpy_seconds(values);
  double best = 1e9;
  for (auto _ : state) {
    best = std::min(best, best_seconds(
                              [&] {
                                auto both =
                                    te::fp8::cast_transpose(x, scale, te::fp8::DType::kE4M3, amax);
                                benchmark::DoNotOptimize(both.first.data.data_ptr());
                              },
                              1));
  }
  state.SetBytesProcessed(state.iterations() * n * n * 4);
  state.counters["fraction_of_memcpy"] = copy / best;
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

at::Tensor randn(int64_t rows, int64_t cols, uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  return at::randn({rows, cols}, g);
}

// The CPU reference FP8 GEMM (operands already FP8, as in a layer) and LibTorch's fp32 at::mm on
// the same sizes, alternated call by call so both see the same machine state (this VM's speed
// drifts); ratio_vs_fp32 = best FP8 time / best fp32 time.
void BM_GemmFp8Reference(benchmark::State& state) {
  const int64_t n = state.range(0);
  const at::Tensor a = randn(n, n, 1), b = randn(n, n, 2);
  const auto qa = te::fp8::quantize(a, at::full({1}, 16.0f), te::fp8::DType::kE4M3);
  const auto qb = te::fp8::quantize(b, at::full({1}, 16.0f), te::fp8::DType::kE4M3);
  double fp8 = 1e9, fp32 = 1e9;
  for (auto _ : state) {
    fp32 = std::min(fp32, best_seconds([&] { benchmark::DoNotOptimize(at::mm(a, b)); }, 1));
    fp8 = std::min(fp8, best_seconds([&] { benchmark::DoNotOptimize(te::fp8::gemm(qa, qb)); }, 1));
  }
  state.counters["fp8_ms"] = fp8 * 1e3;
  state.counters["fp32_ms"] = fp32 * 1e3;
  state.counters["ratio_vs_fp32"] = fp8 / fp32;
  state.counters["fp8_GFLOP/s"] = 2.0 * n * n * n / fp8 / 1e9;
}

// A block-scaled cast (Float8BlockScaling's, te::fp8::quantize_blocks; MXFP8's 1x32,
// te::fp8::quantize_mx; NVFP4's 1x16 / 16x16, te::fp8::quantize_nvfp4) of a 4096^2 fp32 matrix
// against one memcpy of it: each block's amax, its scale, the codes (NVFP4: with the tensor amax
// found by the cast, or given as the recipe gives it).
void BM_QuantizeBlocks(benchmark::State& state, te::fp8::ScalingMode mode, bool amax_given) {
  const int64_t n = state.range(0);
  const auto values = data(n * n);
  const at::Tensor x = at::from_blob(const_cast<float*>(values.data()), {n, n}).clone();
  const float tensor_amax = x.abs().max().item<float>();
  const double copy = memcpy_seconds(values);
  double best = 1e9;
  for (auto _ : state) {
    best = std::min(
        best, best_seconds(
                  [&] {
                    auto q =
                        te::fp8::is_nvfp4(mode)
                            ? te::fp8::quantize_nvfp4(
                                  x, {mode, amax_given ? std::optional<float>(tensor_amax)
                                                       : std::nullopt})
                        : mode == te::fp8::ScalingMode::kBlock1x32
                            ? te::fp8::quantize_mx(x, te::fp8::DType::kE4M3)
                            : te::fp8::quantize_blocks(x, mode, te::fp8::DType::kE4M3, true, 0.0f);
                    benchmark::DoNotOptimize(q.data.data_ptr());
                  },
                  1));
  }
  state.SetBytesProcessed(state.iterations() * n * n * 4);
  state.counters["fraction_of_memcpy"] = copy / best;
}

// The CPU reference block-scaled GEMM (a 1x128 blocks, b_t 128x128 tiles: a forward GEMM of
// Float8BlockScaling) against LibTorch's fp32 at::mm, alternated as above.
void BM_GemmBlockScaled(benchmark::State& state) {
  const int64_t n = state.range(0);
  const at::Tensor a = randn(n, n, 1), b = randn(n, n, 2);
  const auto qa = te::fp8::quantize_blocks(a, te::fp8::ScalingMode::kBlock1x128,
                                           te::fp8::DType::kE4M3, true, 0.0f);
  const auto qb = te::fp8::quantize_blocks(b.t(), te::fp8::ScalingMode::kBlock128x128,
                                           te::fp8::DType::kE4M3, true, 0.0f);
  double fp8 = 1e9, fp32 = 1e9;
  for (auto _ : state) {
    fp32 = std::min(fp32, best_seconds([&] { benchmark::DoNotOptimize(at::mm(a, b)); }, 1));
    fp8 =
        std::min(fp8, best_seconds([&] { benchmark::DoNotOptimize(te::fp8::gemm_nt(qa, qb)); }, 1));
  }
  state.counters["fp8_ms"] = fp8 * 1e3;
  state.counters["fp32_ms"] = fp32 * 1e3;
  state.counters["ratio_vs_fp32"] = fp8 / fp32;
}

BENCHMARK(BM_Memcpy)->Arg(1 << 24);
BENCHMARK_CAPTURE(BM_Quantize, e4m3, te::fp8::DType::kE4M3)->Arg(1 << 24);
BENCHMARK_CAPTURE(BM_Quantize, e5m2, te::fp8::DType::kE5M2)->Arg(1 << 24);
BENCHMARK(BM_CastTranspose)->Arg(4096);
BENCHMARK(BM_Dequantize)->Arg(1 << 24);
BENCHMARK(BM_GemmFp8Reference)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->Iterations(8);
BENCHMARK_CAPTURE(BM_QuantizeBlocks, 1x128, te::fp8::ScalingMode::kBlock1x128, false)->Arg(4096);
BENCHMARK_CAPTURE(BM_QuantizeBlocks, 128x128, te::fp8::ScalingMode::kBlock128x128, false)
    ->Arg(4096);
BENCHMARK_CAPTURE(BM_QuantizeBlocks, 1x32, te::fp8::ScalingMode::kBlock1x32, false)->Arg(4096);
BENCHMARK_CAPTURE(BM_QuantizeBlocks, nvfp4_1x16, te::fp8::ScalingMode::kBlock1x16, false)
    ->Arg(4096);
BENCHMARK_CAPTURE(BM_QuantizeBlocks, nvfp4_16x16, te::fp8::ScalingMode::kBlock16x16, false)
    ->Arg(4096);
// NVFP4 as the recipe casts: the tensor amax known (reduced over the ranks first), one pass.
BENCHMARK_CAPTURE(BM_QuantizeBlocks, nvfp4_1x16_amax_given, te::fp8::ScalingMode::kBlock1x16, true)
    ->Arg(4096);
BENCHMARK_CAPTURE(BM_QuantizeBlocks, nvfp4_16x16_amax_given, te::fp8::ScalingMode::kBlock16x16,
                  true)
    ->Arg(4096);
BENCHMARK(BM_GemmBlockScaled)->Arg(256)->Arg(2048)->Unit(benchmark::kMillisecond)->Iterations(8);

}  // namespace

BENCHMARK_MAIN();
