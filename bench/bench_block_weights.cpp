// GEMMs from weights held in GGUF blocks (te::nn::block_linear) against the float32 GEMM of the
// same weights dequantized (te::nn::functional::dense, the library the model's GEMMs run on:
// TE_CPU_GEMM), alternated (bench/alternate.h), at SmolLM2-135M's shapes: an MLP projection
// [576 -> 1536] of each of 30 layers in turn and the tied LM head [576 -> 49152], Q4_1 (its
// layers) and Q8_0 (its table), for
// 1, 4, 8, 32 and 128 input rows (decode of one stream, of a batch, prefill). ratio_vs_fp32 < 1:
// the blocks are faster. Random blocks with scales near 1.
//
//   bench_block_weights [--benchmark_filter=...]

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <benchmark/benchmark.h>

#include <chrono>

#include "alternate.h"
#include "te/kernels/ggml.h"
#include "te/nn/block_weights.h"
#include "te/nn/functional.h"

namespace {

struct Held {
  at::Tensor bytes;  // owns the blocks
  te::nn::BlockMatrix w;
  at::Tensor kernel;  // the same weights dequantized, [cols, rows] as te holds a kernel
};

Held make(te::ggml::Type type, int64_t rows, int64_t cols) {
  const auto b = te::ggml::block_shape(static_cast<uint32_t>(type), "bench");
  const int64_t row_bytes = cols / b.elements * b.bytes;
  Held h;
  h.bytes = at::randint(0, 256, {rows * row_bytes}, at::kByte);
  unsigned char* p = h.bytes.data_ptr<unsigned char>();
  for (int64_t i = 0; i < rows * (cols / b.elements); ++i) {
    unsigned char* block = p + i * b.bytes;
    block[0] = 0x00, block[1] = 0x20;  // d = 2^-7 (half 0x2000)
    if (type == te::ggml::Type::kQ4_1) block[2] = 0x00, block[3] = 0xA0;  // m = -2^-7
  }
  h.w.type = static_cast<uint32_t>(type);
  h.w.rows = rows;
  h.w.cols = cols;
  for (int64_t r = 0; r < rows; ++r) h.w.row_data.push_back(p + r * row_bytes);
  h.kernel = te::nn::dequantize(h.w).t().contiguous();
  return h;
}

double seconds(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// `copies` matrices (a model's layers: each call reads the next, so the float32 weights come
// from memory as a whole model's do, and the blocks from wherever their smaller total fits).
void BlocksAgainstFp32(benchmark::State& state, te::ggml::Type type, int64_t rows,
                       int copies) {
  c10::InferenceMode inference;
  std::vector<Held> layers;
  for (int i = 0; i < copies; ++i) layers.push_back(make(type, rows, 576));
  const at::Tensor x = at::randn({state.range(0), 576});
  const int calls = rows > 4096 ? 4 : 60;
  te::bench::alternate(
      state,
      [&] {
        return seconds([&] {
          for (int i = 0; i < calls; ++i) te::nn::block_linear(x, layers[i % copies].w, "bench");
        });
      },
      [&] {
        return seconds([&] {
          for (int i = 0; i < calls; ++i) te::nn::functional::dense(x, layers[i % copies].kernel);
        });
      },
      "fp32");
  state.counters["weights_MB_blocks"] =
      static_cast<double>(layers[0].w.bytes()) * copies / 1e6;
  state.counters["threads"] = at::get_num_threads();
}

#define TE_BLOCK_BENCH(name, type, rows, copies)                                       \
  void name(benchmark::State& state) { BlocksAgainstFp32(state, type, rows, copies); } \
  BENCHMARK(name)                                                              \
      ->Arg(1)                                                                 \
      ->Arg(4)                                                                 \
      ->Arg(8)                                                                 \
      ->Arg(32)                                                                \
      ->Arg(128)                                                               \
      ->Iterations(9)                                                          \
      ->UseManualTime()                                                        \
      ->Unit(benchmark::kMillisecond)

TE_BLOCK_BENCH(Q4_1_Mlp, te::ggml::Type::kQ4_1, 1536, 30);
TE_BLOCK_BENCH(Q8_0_LmHead, te::ggml::Type::kQ8_0, 49152, 1);

}  // namespace

int main(int argc, char** argv) { return te::bench::run_benchmarks(argc, argv); }
