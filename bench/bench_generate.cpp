// Generation throughput of te::gen::Engine on a real model (SmolLM2-135M-Instruct, the GGUF the
// interop checks fetch): prefill tokens/s of one prompt, decode tokens/s of one stream, and the
// aggregate decode tokens/s of N concurrent streams on the same engine (continuous batching);
// prints one JSON object. The ratio streams/one is the ">= 6x at 32 streams".
//
// On a shared machine whose speed drifts from minute to minute, one stream measured now and 32
// streams measured a minute later can differ by the drift alone: --rounds R alternates the two
// R times and reports the medians, the median of the R ratios (each from neighbouring windows)
// and their range.
//
// --roof adds, per round, the machine's ceiling for that ratio: the model's decode GEMMs alone
// (every layer's projections, x @ w with w [in, out] as te's kernels are held, and the LM head,
// x @ table^T when tied to the embedding; float32 as the model holds them; through
// te::nn::functional::dense, so on the library the model's GEMMs run on: TE_CPU_GEMM) timed at
// one row and at `streams` rows, whose ratio streams * t(1) / t(streams) is what the step would
// give if it were GEMMs only, and the threads' peak of independent FMAs of the widest vectors
// the CPU has (AVX-512 or AVX2; GFLOP/s), to read the GEMM rate at `streams` rows against.
//
//   bench_generate MODEL.gguf [--streams 32] [--tokens 64] [--prompt-tokens 128] [--threads N]
//                  [--rounds 3] [--contiguous] [--roof] [--system-malloc] [--dequantize]
//
// The model loads as te::hf loads a GGUF file by default, its quantized weights held in their
// blocks (decoded inside each GEMM); --dequantize loads them as float32 (what --roof times).
//
// Like te-serve and te-generate, the bench keeps freed memory for reuse (te::keep_freed_memory);
// --system-malloc leaves glibc's defaults, to measure what that gives.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "te/gen/generate.h"
#include "te/hf/causal_lm.h"
#include "te/nn/functional.h"
#include "te/nn/inference.h"
#include "te/runtime/runtime.h"

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) {
  return std::chrono::duration<double>(clock_type::now() - t).count();
}

std::vector<int64_t> prompt(int64_t n, int64_t salt, int64_t vocab) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back((1000 + 37 * i + 101 * salt) % vocab);
  return ids;
}

struct Figures {
  double prefill_tps = 0, decode_tps = 0;
};

// `streams` requests of `prompt_tokens` each, `tokens` generated each (greedy, no stop). Prefill:
// the prompt tokens over the time to the last first token. Decode: the tokens generated while
// every stream is decoding (from the last first token to the first stream's end), over that
// time: the aggregate rate at `streams` concurrent streams.
Figures run(te::hf::CausalLM model, const te::gen::EngineOptions& options, int64_t streams,
            int64_t prompt_tokens, int64_t tokens) {
  te::gen::Engine engine(model, options);
  te::gen::GenerateOptions g;
  g.max_tokens = tokens;
  g.sampling.temperature = 0;
  for (int64_t s = 0; s < streams; ++s) {
    engine.add(prompt(prompt_tokens, s, model->config.vocab_size), g);
  }
  const auto start = clock_type::now();
  std::set<int64_t> started;
  int64_t decoded = 0;
  double prefill = 0, decode = 0;
  auto decode_start = start;
  bool window = false;
  while (!engine.idle()) {
    const auto events = engine.step();
    const bool ends = std::any_of(events.begin(), events.end(),
                                  [](const auto& e) { return !e.finish_reason.empty(); });
    if (window) {
      decoded += static_cast<int64_t>(events.size());
      if (ends) break;
      continue;
    }
    for (const auto& e : events) started.insert(e.request);  // before the window: who has begun
    if (static_cast<int64_t>(started.size()) >= streams) {
      prefill = seconds_since(start);
      decode_start = clock_type::now();
      window = true;
    }
  }
  decode = seconds_since(decode_start);
  Figures f;
  f.prefill_tps = static_cast<double>(streams * prompt_tokens) / prefill;
  f.decode_tps = static_cast<double>(decoded) / decode;
  return f;
}

// The model's decode GEMMs, [in, out] per matrix: per layer q, k, v, o, gate, up, down, then
// the LM head (as many of them as the model has).
std::vector<std::pair<int64_t, int64_t>> decode_gemms(const te::hf::CausalLMConfig& c) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, i = c.intermediate_size;
  std::vector<std::pair<int64_t, int64_t>> one_layer = {{h, q}, {h, kv}, {h, kv}, {q, h},
                                                        {h, i}, {h, i},  {i, h}};
  std::vector<std::pair<int64_t, int64_t>> all;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    all.insert(all.end(), one_layer.begin(), one_layer.end());
  }
  all.emplace_back(h, c.vocab_size);
  return all;
}

// One decode GEMM as the model runs it: x @ w with w [in, out], or x @ w^T when w is the
// embedding table [vocab, hidden] a tied LM head multiplies by.
struct DecodeGemm {
  at::Tensor w;
  bool table = false;
  int64_t in() const { return w.size(table ? 1 : 0); }
  at::Tensor operator()(const at::Tensor& x) const {
    return te::nn::functional::dense(x, table ? w.t() : w);
  }
};

std::vector<DecodeGemm> decode_weights(const te::hf::CausalLMConfig& c) {
  std::vector<DecodeGemm> gemms;
  for (const auto& [in, out] : decode_gemms(c)) gemms.push_back({at::randn({in, out})});
  if (c.tie_word_embeddings) gemms.back() = {gemms.back().w.t().contiguous(), true};
  return gemms;
}

// Seconds for one pass of the decode GEMMs at `rows` rows (the best of three passes).
double gemm_seconds(const std::vector<DecodeGemm>& gemms, int64_t rows) {
  std::vector<at::Tensor> inputs;
  for (const DecodeGemm& g : gemms) inputs.push_back(at::randn({rows, g.in()}));
  double best = 1e30;
  for (int pass = 0; pass < 3; ++pass) {
    const auto start = clock_type::now();
    for (std::size_t g = 0; g < gemms.size(); ++g) gemms[g](inputs[g]);
    best = std::min(best, seconds_since(start));
  }
  return best;
}

// GFLOP/s of independent FMAs (ten chains a thread) on `threads` threads at once: the arithmetic
// roof a float32 GEMM runs under, with AVX-512 where the CPU has it (oneDNN's GEMMs use it), else
// AVX2. 0 where the CPU lacks both.
__attribute__((target("avx2,fma"))) float fma_chains_avx2(int64_t iterations) {
  __m256 acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = _mm256_set1_ps(1.0f + static_cast<float>(i) * 1e-7f);
  const __m256 a = _mm256_set1_ps(0.9999999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t n = 0; n < iterations; ++n) {
    for (int i = 0; i < 10; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  float sum = 0;
  for (int i = 0; i < 10; ++i) sum += _mm256_cvtss_f32(acc[i]);
  return sum;
}

__attribute__((target("avx512f"))) float fma_chains_avx512(int64_t iterations) {
  __m512 acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = _mm512_set1_ps(1.0f + static_cast<float>(i) * 1e-7f);
  const __m512 a = _mm512_set1_ps(0.9999999f), b = _mm512_set1_ps(1e-7f);
  for (int64_t n = 0; n < iterations; ++n) {
    for (int i = 0; i < 10; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  float sum = 0;
  for (int i = 0; i < 10; ++i) sum += _mm512_reduce_add_ps(acc[i]);
  return sum;
}

double fma_peak_gflops(int threads) {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!avx512 && (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))) return 0;
  const int64_t iterations = 50'000'000;
  std::vector<float> sums(static_cast<std::size_t>(threads));
  const auto start = clock_type::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&sums, t, iterations, avx512] {
      sums[t] = avx512 ? fma_chains_avx512(iterations) : fma_chains_avx2(iterations);
    });
  }
  for (std::thread& t : pool) t.join();
  const double s = seconds_since(start);
  // 16 or 8 lanes x 2 flops per FMA; the sums are read so that no compiler drops the loops.
  const double lanes = avx512 ? 16.0 : 8.0;
  return sums[0] == 0 ? 0 : threads * iterations * 10.0 * lanes * 2.0 / s / 1e9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: bench_generate MODEL [--streams N] [--tokens N] "
                 "[--prompt-tokens N] [--threads N] [--rounds N] [--contiguous] [--roof] "
                 "[--system-malloc]\n");
    return 2;
  }
  int64_t streams = 32, tokens = 64, prompt_tokens = 128, rounds = 3;
  bool contiguous = false, roof = false, system_malloc = false, dequantize = false;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return std::stoll(argv[++i]); };
    if (a == "--streams") {
      streams = next();
    } else if (a == "--tokens") {
      tokens = next();
    } else if (a == "--prompt-tokens") {
      prompt_tokens = next();
    } else if (a == "--threads") {
      at::set_num_threads(static_cast<int>(next()));
    } else if (a == "--rounds") {
      rounds = next();
    } else if (a == "--contiguous") {
      contiguous = true;
    } else if (a == "--roof") {
      roof = true;
    } else if (a == "--system-malloc") {
      system_malloc = true;
    } else if (a == "--dequantize") {
      dequantize = true;
    } else {
      std::fprintf(stderr, "bench_generate: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  const bool kept = !system_malloc && te::keep_freed_memory();
  te::hf::LoadOptions load;
  load.dequantize_gguf = dequantize;
  te::hf::CausalLM model = te::hf::load_causal_lm(argv[1], load);
  te::gen::EngineOptions options;
  options.paged = !contiguous;
  options.max_num_seqs = streams;
  options.max_num_batched_tokens = std::max<int64_t>(512, streams);
  options.max_sequence_length = prompt_tokens + tokens + 16;
  if (rounds < 1) {
    std::fprintf(stderr, "bench_generate: --rounds %lld must be >= 1\n",
                 static_cast<long long>(rounds));
    return 2;
  }
  run(model, options, 1, 16, 4);  // warm-up
  std::vector<double> prefill, one, many, ratio, gemm_ratio, gemm_gflops, peak;
  std::vector<DecodeGemm> gemms;
  double flops = 0;  // per row
  if (roof) {
    c10::InferenceMode inference;
    gemms = decode_weights(model->config);
    for (const DecodeGemm& g : gemms) flops += 2.0 * static_cast<double>(g.w.numel());
  }
  for (int64_t r = 0; r < rounds; ++r) {
    if (roof) {
      c10::InferenceMode inference;
      const double t1 = gemm_seconds(gemms, 1), tn = gemm_seconds(gemms, streams);
      gemm_ratio.push_back(static_cast<double>(streams) * t1 / tn);
      gemm_gflops.push_back(flops * static_cast<double>(streams) / tn / 1e9);
      peak.push_back(fma_peak_gflops(at::get_num_threads()));
      std::fprintf(stderr,
                   "round %lld: GEMMs alone %.2fx (%.1f GFLOP/s at %lld rows; FMA peak %.1f)\n",
                   static_cast<long long>(r + 1), gemm_ratio.back(), gemm_gflops.back(),
                   static_cast<long long>(streams), peak.back());
    }
    const Figures o = run(model, options, 1, prompt_tokens, tokens);
    const Figures m = run(model, options, streams, prompt_tokens, tokens);
    prefill.push_back(o.prefill_tps);
    one.push_back(o.decode_tps);
    many.push_back(m.decode_tps);
    ratio.push_back(m.decode_tps / o.decode_tps);
    std::fprintf(stderr, "round %lld: one stream %.2f tokens/s, %lld streams %.2f: %.2fx\n",
                 static_cast<long long>(r + 1), o.decode_tps, static_cast<long long>(streams),
                 m.decode_tps, ratio.back());
  }
  std::printf(
      "{\"model\": \"%s\", \"weights\": \"%s\", \"resident_mb\": %.1f, \"cpu_gemm\": \"%s\", "
      "\"freed_memory_kept\": %s, \"threads\": %d, "
      "\"prompt_tokens\": %lld, "
      "\"tokens\": %lld, "
      "\"rounds\": %lld, \"prefill_tokens_per_second\": %.1f, "
      "\"decode_tokens_per_second_1_stream\": %.2f, \"streams\": %lld, "
      "\"decode_tokens_per_second_streams\": %.2f, \"ratio\": %.2f, \"ratio_min\": %.2f, "
      "\"ratio_max\": %.2f",
      argv[1], dequantize ? "float32" : "gguf blocks where quantized",
      static_cast<double>(te::nn::resident_bytes(*model)) / 1e6,
      te::nn::cpu_gemm_library().c_str(), kept ? "true" : "false", at::get_num_threads(),
      static_cast<long long>(prompt_tokens), static_cast<long long>(tokens),
      static_cast<long long>(rounds), median(prefill), median(one), static_cast<long long>(streams),
      median(many), median(ratio), *std::min_element(ratio.begin(), ratio.end()),
      *std::max_element(ratio.begin(), ratio.end()));
  if (roof) {
    std::printf(
        ", \"gemm_only_ratio\": %.2f, \"gemm_gflops_streams\": %.1f, \"fma_peak_gflops\": %.1f",
        median(gemm_ratio), median(gemm_gflops), median(peak));
  }
  std::printf("}\n");
  return 0;
}
