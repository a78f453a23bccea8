// te-train's MFU (see mfu.h).

#include "mfu.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <tuple>
#include <utility>
#include <vector>

#include "te/distributed.h"
#include "te/nn/sharded.h"
#include "te/program/layout.h"
#include "te/program/report.h"

namespace train {

namespace {

bool starts(const std::string& name, const std::string& module) {
  return name == module || name.rfind(module + ".", 0) == 0;
}

int64_t gemm_params(const te::hf::CausalLMImpl& model) {
  int64_t n = 0;
  const bool tied = model.config.tie_word_embeddings;
  for (const auto& item : model.named_modules()) {
    if (starts(item.key(), "position") || (!tied && starts(item.key(), "embed"))) continue;
    const auto* sharded = dynamic_cast<const te::nn::ShardedModule*>(item.value().get());
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      if (!p.value().requires_grad()) continue;
      int64_t numel = p.value().numel();
      if (sharded != nullptr) {
        const auto layout = sharded->parameter_layouts().find(p.key());
        if (layout != sharded->parameter_layouts().end()) {
          const std::vector<int64_t>& shape = layout->second.global_shape;
          numel = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<>());
        }
      }
      n += numel;
    }
  }
  return n;
}

// The best rate of a dense n^3 GEMM in `dtype` over `reps` timed runs (after an untimed one),
// from a generator of its own (the run's seeded ones untouched).
double gemm_flops(int64_t n, at::ScalarType dtype, int reps) {
  at::Generator gen = at::detail::createCPUGenerator(0);
  const at::Tensor a = at::randn({n, n}, gen).to(dtype);
  const at::Tensor b = at::randn({n, n}, gen).to(dtype);
  at::matmul(a, b);
  double best = 0;
  for (int i = 0; i < reps; ++i) {
    const auto begin = std::chrono::steady_clock::now();
    const at::Tensor c = at::matmul(a, b);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    best = std::max(best, 2.0 * static_cast<double>(n * n * n) / s);
  }
  return best;
}

// The best rate, and the dtype it came in: 1024^3 in `dtype` and, where it is not fp32, in fp32
// too; then 2048^3 in the faster unless 1024^3 took over 50 ms (a slow or busy machine: the
// measurement stays well under a second).
std::pair<double, at::ScalarType> measured_peak(at::ScalarType dtype) {
  const te::DeviceMesh* mesh = te::current_mesh();
  if (mesh != nullptr) mesh->barrier();  // every rank at once: each measures its share
  double peak = gemm_flops(1024, dtype, 4);
  at::ScalarType fastest = dtype;
  if (dtype != at::kFloat) {
    const double fp32 = gemm_flops(1024, at::kFloat, 4);
    if (fp32 > peak) std::tie(peak, fastest) = std::pair(fp32, at::kFloat);
  }
  if (2.0 * 1024 * 1024 * 1024 / peak < 0.05) peak = std::max(peak, gemm_flops(2048, fastest, 2));
  if (mesh == nullptr) return {peak, fastest};
  return {te::program::reduce_over_ranks(*mesh, peak, te::ReduceOp::kSum), fastest};
}

}  // namespace

Mfu make_mfu(const Args& a, const te::hf::CausalLMImpl& model) {
  Mfu m;
  const te::hf::CausalLMConfig& c = model.config;
  m.gemm_params = gemm_params(model);
  m.flops_per_token =
      6.0 * static_cast<double>(m.gemm_params) +
      12.0 * static_cast<double>(c.num_hidden_layers * c.num_attention_heads * c.head_dim) *
          static_cast<double>(a.seq_len);
  if (a.peak_tflops) {
    m.peak_flops = *a.peak_tflops * 1e12;
    m.peak_source = "--peak-tflops";
    return m;
  }
  // fp16: te's CPU GEMMs multiply float16 operands in fp32 (LibTorch 1.13 has no CPU fp16 GEMM;
  // modules/src/matmul.cpp), so fp32's peak is the one they can reach.
  const at::ScalarType dtype = a.dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  const auto begin = std::chrono::steady_clock::now();
  const auto [peak, fastest] = measured_peak(dtype);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  m.peak_flops = peak;
  m.peak_source = "measured in " + te::program::fmt("%.2f", s) + "s: the best " +
                  (fastest == at::kFloat ? "fp32" : a.dtype) + " GEMM" +
                  (dtype == at::kFloat ? "" : " (bf16 and fp32 tried)") + " on " +
                  std::to_string(at::get_num_threads()) +
                  (at::get_num_threads() == 1 ? " thread a rank" : " threads a rank");
  return m;
}

}  // namespace train
