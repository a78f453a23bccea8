// What planning a step costs (te::nn::plan): a 7B-shaped stack (32 layers) on 64 x 16 ranks, and
// te-encoder's layer on one rank against running that layer's real training step on this CPU (the
// peer: planning is worth it when it costs a fraction of what it sizes). Run:
// build/bench/bench_plan
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/autograd.h>

#include "te/nn.h"

namespace {

te::nn::TransformerLayerOptions llama_7b_layer() {
  return [&] {
    auto made = te::nn::TransformerLayerOptions(4096, 11008, 32).mlp_activations({"swiglu"});
    made.self_attention().layernorm().layernorm_type("rmsnorm");
    return made;
  }();
}

te::nn::TransformerLayerOptions encoder_layer() {
  return te::nn::TransformerLayerOptions(256, 1024, 8).mlp_activations({"gelu"});
}

void BM_Plan7BOn64x16(benchmark::State& state) {
  te::set_warning_handler([](std::string_view) {});
  te::MeshResourceScope resource(te::parse_mesh_resource("dp=data,tp=model"));
  for (auto _ : state) {
    benchmark::DoNotOptimize(te::nn::plan(te::nn::PlanOptions(llama_7b_layer(), 32, 64, 2048)
                                              .mesh_shape({64, 16})
                                              .mesh_axes({"data", "model"})
                                              .dtype(at::kBFloat16)));
  }
  te::set_warning_handler(nullptr);
}
BENCHMARK(BM_Plan7BOn64x16)->Unit(benchmark::kMillisecond);

void BM_PlanEncoderLayer(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(te::nn::plan(te::nn::PlanOptions(encoder_layer(), 1, 64, 32)));
  }
}
BENCHMARK(BM_PlanEncoderLayer)->Unit(benchmark::kMillisecond);

// The peer: the same layer's real forward + backward on a batch of 64 x 32 tokens.
void BM_RunEncoderLayerStep(benchmark::State& state) {
  te::nn::TransformerLayer layer(encoder_layer());
  const at::Tensor x = at::randn({64, 32, 256});
  for (auto _ : state) {
    const at::Tensor y = layer(x);
    torch::autograd::backward({y}, {at::ones_like(y)});
  }
}
BENCHMARK(BM_RunEncoderLayerStep)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
