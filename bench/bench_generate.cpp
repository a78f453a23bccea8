// Generation throughput of te::hf::Engine on a real model (SmolLM2-135M-Instruct, the GGUF the
// interop checks fetch): prefill tokens/s of one prompt, decode tokens/s of one stream, and the
// aggregate decode tokens/s of N concurrent streams on the same engine (continuous batching);
// prints one JSON object. The ratio streams/one is the ">= 6x at 32 streams".
//
// On a shared machine whose speed drifts from minute to minute, one stream measured now and 32
// streams measured a minute later can differ by the drift alone: --rounds R alternates the two
// R times and reports the medians, the median of the R ratios (each from neighbouring windows)
// and their range.
//
//   bench_generate MODEL.gguf [--streams 32] [--tokens 64] [--prompt-tokens 128] [--threads N]
//                  [--rounds 3] [--contiguous]

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "te/hf/causal_lm.h"
#include "te/hf/generate.h"

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
Figures run(te::hf::CausalLM model, const te::hf::EngineOptions& options, int64_t streams,
            int64_t prompt_tokens, int64_t tokens) {
  te::hf::Engine engine(model, options);
  te::hf::GenerateOptions g;
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
                 "[--prompt-tokens N] [--threads N] [--rounds N] [--contiguous]\n");
    return 2;
  }
  int64_t streams = 32, tokens = 64, prompt_tokens = 128, rounds = 3;
  bool contiguous = false;
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
    } else {
      std::fprintf(stderr, "bench_generate: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  te::hf::CausalLM model = te::hf::load_causal_lm(argv[1]);
  te::hf::EngineOptions options;
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
  std::vector<double> prefill, one, many, ratio;
  for (int64_t r = 0; r < rounds; ++r) {
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
      "{\"model\": \"%s\", \"threads\": %d, \"prompt_tokens\": %lld, \"tokens\": %lld, "
      "\"rounds\": %lld, \"prefill_tokens_per_second\": %.1f, "
      "\"decode_tokens_per_second_1_stream\": %.2f, \"streams\": %lld, "
      "\"decode_tokens_per_second_streams\": %.2f, \"ratio\": %.2f, \"ratio_min\": %.2f, "
      "\"ratio_max\": %.2f}\n",
      argv[1], at::get_num_threads(), static_cast<long long>(prompt_tokens),
      static_cast<long long>(tokens), static_cast<long long>(rounds), median(prefill), median(one),
      static_cast<long long>(streams), median(many), median(ratio),
      *std::min_element(ratio.begin(), ratio.end()), *std::max_element(ratio.begin(), ratio.end()));
  return 0;
}
