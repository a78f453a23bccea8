// One TransformerLayer forward+backward on a GPU: the same layer written in plain LibTorch BF16
// (SDPA with is_causal; outputs checked close first), te's in BF16, and te's with its GEMMs in
// FP8 under Fp8Autocast (DelayedScaling: E4M3 forward, E5M2 backward). Prints milliseconds per
// step (median of 20 after 5 warm-up steps), the model TFLOP/s of each and the ratios.
//   bench_layer_gpu [tokens_per_sequence=2048] [batch=4] [hidden=4096] [ffn=16384] [heads=32]
// With TE_BENCH_PROFILE=bf16 or fp8 it runs only that variant's step, twice (a warm-up and the
// step), and times nothing: for a profiler (scripts/gpu-profile.sh runs it under Nsight Compute).
//   bench_layer_gpu --grouped [experts=64] [rows_per_expert=64] [hidden=2048] [ffn=1024]
// times GroupedLinear's forward+backward in bf16 (one cuBLAS grouped GEMM per pass) against the
// loop it replaces (each expert's rows through its own kernel and bias, as separate parameters,
// concatenated), outputs checked close first.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <ATen/detail/CUDAHooksInterface.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "plain_layer.h"
#include "te/fp8.h"
#include "te/nn.h"

namespace {

double median_ms(const std::function<void()>& step) {
  for (int i = 0; i < 5; ++i) step();
  std::vector<double> ms;
  for (int i = 0; i < 20; ++i) {
    const auto start = std::chrono::steady_clock::now();
    step();
    at::detail::getCUDAHooks().deviceSynchronize(0);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

// GroupedLinear against a per-expert loop (see the header).
int grouped(int64_t experts, int64_t rows, int64_t hidden, int64_t ffn) {
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  te::nn::GroupedLinear layer(te::nn::GroupedLinearOptions(experts, hidden, ffn));
  layer->to(at::kCUDA, at::kBFloat16);
  std::vector<at::Tensor> kernels, biases;
  for (int64_t g = 0; g < experts; ++g) {
    kernels.push_back(layer->kernel[g].detach().clone().requires_grad_(true));
    biases.push_back(layer->bias[g].detach().clone().requires_grad_(true));
  }
  const std::vector<int64_t> splits(static_cast<std::size_t>(experts), rows);
  const at::Tensor x = at::randn({experts * rows, hidden}, bf16).requires_grad_(true);
  const at::Tensor dy = at::randn({experts * rows, ffn}, bf16);
  const auto loop = [&] {
    std::vector<at::Tensor> parts;
    for (int64_t g = 0; g < experts; ++g) {
      parts.push_back(at::addmm(biases[g], x.narrow(0, g * rows, rows), kernels[g]));
    }
    return at::cat(parts, 0);
  };
  {
    at::NoGradGuard no_grad;
    const at::Tensor a = layer->forward(x, splits), b = loop();
    const double err = ((a - b).abs().max() / b.abs().max()).item<double>();
    std::printf("per-expert loop vs GroupedLinear: max relative difference %.2e\n", err);
    if (err > 5e-2) return 1;
  }
  const double t_loop = median_ms([&] {
    for (auto* list : {&kernels, &biases})
      for (at::Tensor& p : *list) p.mutable_grad() = at::Tensor();
    loop().backward(dy);
  });
  const double t_grouped = median_ms([&] {
    layer->zero_grad();
    layer->forward(x, splits).backward(dy);
  });
  std::printf("GroupedLinear fwd+bwd bf16, %lld experts x %lld rows, %lld -> %lld\n",
              static_cast<long long>(experts), static_cast<long long>(rows),
              static_cast<long long>(hidden), static_cast<long long>(ffn));
  std::printf("  per-expert loop: %8.3f ms\n  GroupedLinear  : %8.3f ms  loop/grouped = %.2fx\n",
              t_loop, t_grouped, t_loop / t_grouped);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (!at::hasCUDA()) {
    std::printf(
        "bench_layer_gpu: no CUDA device (or this LibTorch has no CUDA); nothing to time\n");
    return 0;
  }
  auto arg = [&](int i, int64_t fallback) { return argc > i ? std::atoll(argv[i]) : fallback; };
  if (argc > 1 && std::string(argv[1]) == "--grouped") {
    return grouped(arg(2, 64), arg(3, 64), arg(4, 2048), arg(5, 1024));
  }
  const int64_t seq = arg(1, 2048), batch = arg(2, 4), hidden = arg(3, 4096), ffn = arg(4, 16384),
                heads = arg(5, 32);
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  te::nn::TransformerLayer layer([&] {
    auto made = te::nn::TransformerLayerOptions(hidden, ffn, heads)
                    .hidden_dropout(0.0)
                    .intermediate_dropout(0.0)
                    .mlp_activations({"gelu"});
    made.self_attention().attention().attention_dropout(0.0);
    return made;
  }());
  layer->to(at::kCUDA, at::kBFloat16);
  const at::Tensor x = at::randn({batch, seq, hidden}, bf16).requires_grad_(true);
  const at::Tensor dy = at::randn({batch, seq, hidden}, bf16);

  const auto te_bf16_step = [&] {
    layer->zero_grad();
    layer->forward(x).backward(dy);
  };
  const auto te_fp8_step = [&] {
    layer->zero_grad();
    at::Tensor y;
    {
      te::Fp8Autocast autocast(true);
      y = layer->forward(x);
    }
    y.backward(dy);
  };
  if (const char* only = std::getenv("TE_BENCH_PROFILE")) {
    const std::string variant = only;
    if (variant != "bf16" && variant != "fp8") {
      std::fprintf(stderr, "bench_layer_gpu: TE_BENCH_PROFILE is '%s'; use bf16 or fp8\n", only);
      return 2;
    }
    for (int i = 0; i < 2; ++i) variant == "fp8" ? te_fp8_step() : te_bf16_step();
    at::detail::getCUDAHooks().deviceSynchronize(0);
    std::printf("bench_layer_gpu: ran te %s twice for the profiler\n", only);
    return 0;
  }

  // The plain peer on the module's own parameters (gelu tanh form, as te's).
  const te::bench::Params params = te::bench::copy_parameters(*layer);
  const at::Tensor x_plain = x.detach().clone().requires_grad_(true);
  {
    at::NoGradGuard no_grad;
    const at::Tensor a = layer->forward(x), b = te::bench::plain_layer(x, params, heads, true);
    const double err = ((a - b).abs().max() / b.abs().max()).item<double>();
    std::printf("plain LibTorch layer vs te: max relative difference %.2e\n", err);
    if (err > 5e-2) {
      std::printf("bench_layer_gpu: the plain layer does not compute te's layer\n");
      return 1;
    }
  }
  auto plain_params = [&] {
    for (const auto& [name, p] : params) p.mutable_grad() = at::Tensor();
  };
  const double t_plain = median_ms([&] {
    plain_params();
    te::bench::plain_layer(x_plain, params, heads, true).backward(dy);
  });
  const double t_bf16 = median_ms(te_bf16_step);
  const double t_fp8 = median_ms(te_fp8_step);
  const double flops =
      2.0 * 3 * batch * seq * (4.0 * hidden * hidden + 2.0 * hidden * ffn + 2.0 * seq * hidden);
  std::printf(
      "TransformerLayer fwd+bwd, batch %lld x seq %lld, hidden %lld, ffn %lld, heads %lld\n",
      static_cast<long long>(batch), static_cast<long long>(seq), static_cast<long long>(hidden),
      static_cast<long long>(ffn), static_cast<long long>(heads));
  std::printf("  plain LibTorch bf16: %8.2f ms  (%.0f TFLOP/s)\n", t_plain, flops / t_plain / 1e9);
  std::printf("  te bf16           : %8.2f ms  (%.0f TFLOP/s)  te/plain = %.3fx\n", t_bf16,
              flops / t_bf16 / 1e9, t_bf16 / t_plain);
  std::printf("  te fp8            : %8.2f ms  (%.0f TFLOP/s)  fp8/te bf16 = %.3fx\n", t_fp8,
              flops / t_fp8 / 1e9, t_fp8 / t_bf16);
  return 0;
}
