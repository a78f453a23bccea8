// The modules on a CUDA device against the same modules on the CPU: outputs and every gradient.
// Fused attention on CUDA through LibTorch's scaled-dot-product attention with its cuDNN backend,
// held to the unfused path, and the backend that ran is reported. These run where LibTorch has
// CUDA and sees a GPU (scripts/gpu-check.sh), and skip elsewhere.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <iostream>
#include <memory>
#include <string>

#include "te/compat.h"
#include "te/nn.h"

namespace te::nn {
namespace {

bool have_cuda() { return at::hasCUDA(); }

at::Tensor randn(at::IntArrayRef shape, uint64_t seed) {
  at::manual_seed(seed);
  return at::randn(shape);
}

double max_rel(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor x = a.detach().cpu().to(at::kDouble), y = b.detach().cpu().to(at::kDouble);
  return ((x - y).abs().max() / y.abs().max().clamp_min(1e-12)).item<double>();
}

// Runs `module` on the CPU and a copy of it on cuda:0 on the same input; compares the output and
// the gradient of every parameter and of the input.
template <typename Module, typename Forward>
void expect_cuda_matches_cpu(Module cpu, const at::Tensor& input, Forward forward,
                             const std::string& name, double tol = 1e-4) {
  auto gpu = std::dynamic_pointer_cast<typename Module::Impl>(cpu->clone());
  ASSERT_TRUE(gpu) << name;
  gpu->to(at::kCUDA);
  const at::Tensor x_cpu = input.clone().requires_grad_(true);
  const at::Tensor x_gpu = input.to(at::kCUDA).requires_grad_(true);
  const at::Tensor y_cpu = forward(*cpu, x_cpu);
  const at::Tensor y_gpu = forward(*gpu, x_gpu);
  EXPECT_TRUE(y_gpu.is_cuda()) << name;
  EXPECT_LT(max_rel(y_gpu, y_cpu), tol) << name << " output";
  const at::Tensor seed = randn(y_cpu.sizes(), 99);
  (y_cpu * seed).sum().backward();
  (y_gpu * seed.to(at::kCUDA)).sum().backward();
  EXPECT_LT(max_rel(x_gpu.grad(), x_cpu.grad()), tol) << name << " input gradient";
  const auto p_cpu = cpu->named_parameters(), p_gpu = gpu->named_parameters();
  for (const auto& item : p_cpu) {
    EXPECT_LT(max_rel(p_gpu[item.key()].grad(), item.value().grad()), tol)
        << name << " gradient of " << item.key();
  }
}

TEST(ModulesOnCuda, OutputsAndGradientsMatchTheCpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device (or this LibTorch has no CUDA)";
  // FP32 GEMMs in full precision on both sides (no TF32).
  at::globalContext().setAllowTF32CuBLAS(false);
  at::globalContext().setAllowTF32CuDNN(false);
  const at::Tensor x = randn({4, 16, 64}, 1);
  at::manual_seed(2);
  expect_cuda_matches_cpu(
      Dense(DenseOptions(64, 96)), x,
      [](DenseImpl& m, const at::Tensor& t) { return m.forward(t); }, "Dense");
  at::manual_seed(3);
  expect_cuda_matches_cpu(
      LayerNormMLP(LayerNormMLPOptions(64, 128).activations({"gelu", "linear"})), x,
      [](LayerNormMLPImpl& m, const at::Tensor& t) { return m.forward(t); }, "LayerNormMLP");
  at::manual_seed(4);
  expect_cuda_matches_cpu(
      MultiHeadAttention(MultiHeadAttentionOptions(64, 8).attn_mask_type("causal")), x,
      [](MultiHeadAttentionImpl& m, const at::Tensor& t) { return m.forward(t); },
      "MultiHeadAttention");
  at::manual_seed(5);
  expect_cuda_matches_cpu(
      TransformerLayer(
          TransformerLayerOptions(64, 128, 8).hidden_dropout(0.0).attention_dropout(0.0)),
      x, [](TransformerLayerImpl& m, const at::Tensor& t) { return m.forward(t); },
      "TransformerLayer");
}

TEST(ModulesOnCuda, FusedAttentionRunsCudnnAndMatchesTheUnfusedPath) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device (or this LibTorch has no CUDA)";
#if TE_HAS_CUDNN_SDPA
  // cuDNN's attention is chosen through LibTorch's own switches. They are process-wide, so the
  // library never flips them; this test's process does, to run cuDNN and nothing else.
  auto& ctx = at::globalContext();
  ctx.setSDPUseFlash(false);
  ctx.setSDPUseMemEfficient(false);
  ctx.setSDPUseCuDNN(true);
  at::Tensor q = randn({2, 128, 8, 64}, 11).to(at::kCUDA, at::kBFloat16);
  at::Tensor k = randn({2, 128, 8, 64}, 12).to(at::kCUDA, at::kBFloat16);
  at::Tensor v = randn({2, 128, 8, 64}, 13).to(at::kCUDA, at::kBFloat16);
  const int64_t choice =
      at::_fused_sdp_choice(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), {}, 0.0, true);
  std::cout << "attention backend: " << compat::sdp_backend_name(choice) << std::endl;
  EXPECT_EQ(std::string(compat::sdp_backend_name(choice)), "cudnn_attention");
  DotProductAttention fused(DotProductAttentionOptions(8, 64).attn_mask_type("causal").fused(true));
  DotProductAttention unfused(
      DotProductAttentionOptions(8, 64).attn_mask_type("causal").fused(false));
  EXPECT_LT(max_rel(fused(q, k, v), unfused(q, k, v)), 2e-2);
  ctx.setSDPUseFlash(true);
  ctx.setSDPUseMemEfficient(true);
#else
  GTEST_SKIP() << "this LibTorch (" << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR
               << ") has no cuDNN backend in scaled_dot_product_attention (2.5+)";
#endif
}

}  // namespace
}  // namespace te::nn
