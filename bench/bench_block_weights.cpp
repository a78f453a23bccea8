// GEMMs from weights held in GGUF blocks (te::nn::block_linear) against the float32 GEMM of the
// same weights dequantized (te::nn::functional::dense, the library the model's GEMMs run on:
// TE_CPU_GEMM), alternated (bench/alternate.h), at SmolLM2-135M's shapes: an MLP projection
// [576 -> 1536] of each of 30 layers in turn and the tied LM head [576 -> 49152], Q4_1 (its
// layers) and Q8_0 (its table), for
// 1, 4, 8, 32 and 128 input rows (decode of one stream, of a batch, prefill). ratio_vs_fp32 < 1:
// the blocks are faster. Random blocks with scales near 1. Decode_<type> and Dot_<type>: each
// ggml type's decoding and one-input row product speed per weight against Q4_1's.
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

// Where a type keeps its float16 scales in a block (offset, count): set to 2^-7 (and a Q4_1
// or Q5_1 offset to -2^-7), so no value is subnormal, infinite or NaN.
std::pair<int, int> scales_of(te::ggml::Type type) {
  using T = te::ggml::Type;
  switch (type) {
    case T::kQ2_K:
      return {80, 2};
    case T::kQ3_K:
      return {108, 1};
    case T::kQ6_K:
      return {208, 1};
    case T::kQ4_1:
    case T::kQ5_1:
    case T::kQ4_K:
    case T::kQ5_K:
      return {0, 2};
    default:
      return {0, 1};
  }
}

Held make(te::ggml::Type type, int64_t rows, int64_t cols) {
  const auto b = te::ggml::block_shape(static_cast<uint32_t>(type), "bench");
  const int64_t row_bytes = cols / b.elements * b.bytes;
  Held h;
  h.bytes = at::randint(0, 256, {rows * row_bytes}, at::kByte);
  unsigned char* p = h.bytes.data_ptr<unsigned char>();
  const auto [offset, count] = scales_of(type);
  for (int64_t i = 0; i < rows * (cols / b.elements); ++i) {
    unsigned char* block = p + i * b.bytes + offset;
    if (type == te::ggml::Type::kMXFP4) {  // an E8M0 scale byte: d = 2^-7 (its half, 2^-8)
      block[0] = 120;
      continue;
    }
    block[0] = 0x00, block[1] = 0x20;  // d = 2^-7 (half 0x2000)
    if (count == 2) block[2] = 0x00, block[3] = 0xA0;  // m or dmin = -2^-7
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

// Decoding speed per weight against Q4_1's, alternated on matrices of the same shape [1536, 768]
// (768: whole K-quant blocks): what a GEMM's panels pay for each type llama.cpp's mixes use.
// ratio_vs_Q4_1 is this type's time over Q4_1's for the same number of weights.
// Dot_<type>: the same for the row products of one input (te::ggml::dot_rows, what one stream's
// decode step runs), also against Q4_1's.
void DecodeAgainstQ4_1(benchmark::State& state, te::ggml::Type type) {
  const Held w = make(type, 1536, 768);
  const Held q4_1 = make(te::ggml::Type::kQ4_1, 1536, 768);
  std::vector<float> out(static_cast<std::size_t>(1536 * 768));
  auto decode = [&](const Held& h) {
    return seconds([&] {
      for (int i = 0; i < 4; ++i) {
        te::ggml::dequantize_rows(h.w.type, h.w.row_data.data(), h.w.rows, h.w.cols, out.data(),
                                  h.w.cols);
      }
    });
  };
  te::bench::alternate(
      state, [&] { return decode(w); }, [&] { return decode(q4_1); }, "Q4_1");
  state.counters["weights"] = static_cast<double>(1536 * 768);
}

void DotAgainstQ4_1(benchmark::State& state, te::ggml::Type type) {
  const Held w = make(type, 1536, 768);
  const Held q4_1 = make(te::ggml::Type::kQ4_1, 1536, 768);
  const at::Tensor x = at::randn({768});
  std::vector<float> y(1536);
  auto dot = [&](const Held& h) {
    return seconds([&] {
      for (int i = 0; i < 16; ++i) {
        te::ggml::dot_rows(h.w.type, h.w.row_data.data(), h.w.rows, h.w.cols,
                           x.data_ptr<float>(), 1, 768, y.data(), 1536);
      }
    });
  };
  te::bench::alternate(
      state, [&] { return dot(w); }, [&] { return dot(q4_1); }, "Q4_1");
  state.counters["weights"] = static_cast<double>(1536 * 768);
}

#define TE_DECODE_BENCH(name)                                                                \
  void Decode_##name(benchmark::State& state) {                                              \
    DecodeAgainstQ4_1(state, te::ggml::Type::k##name);                                       \
  }                                                                                          \
  BENCHMARK(Decode_##name)->Iterations(9)->UseManualTime()->Unit(benchmark::kMillisecond);   \
  void Dot_##name(benchmark::State& state) { DotAgainstQ4_1(state, te::ggml::Type::k##name); } \
  BENCHMARK(Dot_##name)->Iterations(9)->UseManualTime()->Unit(benchmark::kMillisecond)

TE_DECODE_BENCH(Q4_0);
TE_DECODE_BENCH(Q5_0);
TE_DECODE_BENCH(Q5_1);
TE_DECODE_BENCH(Q8_0);
TE_DECODE_BENCH(Q2_K);
TE_DECODE_BENCH(Q3_K);
TE_DECODE_BENCH(Q4_K);
TE_DECODE_BENCH(Q5_K);
TE_DECODE_BENCH(Q6_K);
TE_DECODE_BENCH(IQ4_NL);
TE_DECODE_BENCH(IQ4_XS);
TE_DECODE_BENCH(MXFP4);

}  // namespace

int main(int argc, char** argv) { return te::bench::run_benchmarks(argc, argv); }
