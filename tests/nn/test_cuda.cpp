// The modules on a CUDA device against the same modules on the CPU: outputs and every gradient.
// Fused attention on CUDA through LibTorch's scaled-dot-product attention with its cuDNN backend,
// held to the unfused path, and the backend that ran is reported. These run where LibTorch has
// CUDA and sees a GPU (scripts/gpu-check.sh), and skip elsewhere.
#include <ATen/ATen.h>
#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>

#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "te/compat.h"
#include "te/distributed.h"
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
  // The same dropout draws on both devices (LayerNormMLP and TransformerLayer drop 0.1 of
  // their intermediate activations by default): te's RNG state as it was for each forward.
  const RngState rng = rng_state();
  const at::Tensor y_cpu = forward(*cpu, x_cpu);
  set_rng_state(rng);
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
      MultiHeadAttention([&] {
        auto made = MultiHeadAttentionOptions(64, 8);
        made.attention().attn_mask_type("causal");
        return made;
      }()),
      x, [](MultiHeadAttentionImpl& m, const at::Tensor& t) { return m.forward(t); },
      "MultiHeadAttention");
  at::manual_seed(5);
  expect_cuda_matches_cpu(
      TransformerLayer([&] {
        auto made = TransformerLayerOptions(64, 128, 8).hidden_dropout(0.0);
        made.self_attention().attention().attention_dropout(0.0);
        return made;
      }()),
      x, [](TransformerLayerImpl& m, const at::Tensor& t) { return m.forward(t); },
      "TransformerLayer");
}

// GroupedLinear's GEMMs on the device, one cuBLAS grouped GEMM per pass (forward, dgrad,
// wgrad): uneven groups and an empty one, with and without biases, fp32 (no TF32) and bf16; and
// sizes whose rows are not 16-byte multiples (47 -> 33), which the per-group loop takes.
TEST(ModulesOnCuda, GroupedLinearsGroupedGemmMatchesTheCpu) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device (or this LibTorch has no CUDA)";
  at::globalContext().setAllowTF32CuBLAS(false);
  const std::vector<int64_t> splits = {7, 0, 33, 1, 19};
  const auto forward = [&](GroupedLinearImpl& m, const at::Tensor& t) {
    return m.forward(t, splits);
  };
  for (const auto& [in, out] : {std::pair<int64_t, int64_t>{48, 40}, {47, 33}}) {
    for (const bool bias : {true, false}) {
      at::manual_seed(6);
      GroupedLinear experts(GroupedLinearOptions(5, in, out).use_bias(bias));
      if (bias) {
        torch::NoGradGuard no_grad;
        experts->bias.normal_();
      }
      const std::string name = "GroupedLinear " + std::to_string(in) + " -> " +
                               std::to_string(out) + (bias ? "" : " without biases");
      expect_cuda_matches_cpu(experts, randn({60, in}, 7), forward, name);
      experts->to(at::kBFloat16);
      expect_cuda_matches_cpu(experts, randn({60, in}, 8).to(at::kBFloat16), forward,
                              name + " bf16", 3e-2);
    }
  }
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
  DotProductAttention fused(DotProductAttentionOptions(8, 64).attn_mask_type("causal").fused(true));
  DotProductAttention unfused(
      DotProductAttentionOptions(8, 64).attn_mask_type("causal").fused(false));
  fused->eval();
  // The backend of the module's own call (causal without a padding mask: is_causal, no bias).
  const std::string backend = fused->fused_backend(q, k, v);
  std::cout << "attention backend: " << backend << std::endl;
  EXPECT_EQ(backend, "cudnn_attention");
  EXPECT_LT(max_rel(fused(q, k, v), unfused(q, k, v)), 2e-2);
  ctx.setSDPUseFlash(true);
  ctx.setSDPUseMemEfficient(true);
#else
  GTEST_SKIP() << "this LibTorch (" << TORCH_VERSION_MAJOR << "." << TORCH_VERSION_MINOR
               << ") has no cuDNN backend in scaled_dot_product_attention (2.5+)";
#endif
}

// Dropout on the device draws the CPU's mask (te's Philox kernel, no host mask): a piece of a
// global tensor, in float and bf16, forward and gradient; and a TransformerLayer in training.
TEST(ModulesOnCuda, DropoutOnTheDeviceDrawsTheCpusMask) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device (or this LibTorch has no CUDA)";
  const std::vector<int64_t> global = {4, 6, 130}, offsets = {1, 2, 3};
  const at::Tensor x = randn({2, 3, 101}, 31);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor out[2], grad[2];
    for (int on_gpu = 0; on_gpu < 2; ++on_gpu) {
      set_rng_state({1234, 7});
      // detach: on the CPU in float, to() returns x itself, which must stay a leaf without grad.
      at::Tensor in = x.to(on_gpu ? at::kCUDA : at::kCPU, dtype).detach().requires_grad_(true);
      out[on_gpu] = functional::dropout(in, 0.3, true, global, offsets);
      out[on_gpu].sum().backward();
      grad[on_gpu] = in.grad();
    }
    EXPECT_TRUE(at::equal(out[1].cpu(), out[0])) << dtype;
    EXPECT_TRUE(at::equal(grad[1].cpu(), grad[0])) << dtype;
  }
  manual_seed(6);
  TransformerLayer layer([&] {
    auto made = TransformerLayerOptions(64, 128, 8);
    made.self_attention().attention().fused(false);
    return made;
  }());
  at::globalContext().setAllowTF32CuBLAS(false);
  const at::Tensor h = randn({2, 16, 64}, 32);
  at::Tensor y[2];
  for (int on_gpu = 0; on_gpu < 2; ++on_gpu) {
    auto m = std::dynamic_pointer_cast<TransformerLayerImpl>(layer->clone());
    m->to(on_gpu ? at::kCUDA : at::kCPU);
    m->train();
    set_rng_state({99, 0});
    y[on_gpu] = m->forward(h.to(on_gpu ? at::kCUDA : at::kCPU));
  }
  EXPECT_LT(max_rel(y[1], y[0]), 1e-4) << "same dropout masks on both devices";
}

// LibTorch runs the backward of CUDA tensors on a device thread of its own. A node that keeps
// the builder's scopes and lends them in backward, as te's nodes do, records into the builder's
// CommTrace from there (on the CPU, Fp8Parallel.BackwardOnAnotherThread... covers te's own
// nodes with real collectives; one GPU cannot run two NCCL ranks).
std::thread::id backward_thread;

struct RecordsInBackward : torch::autograd::Function<RecordsInBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    ctx->saved_data["scopes"] = ScopeCapture::current().to_ivalue();
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const ScopeLoan loan(ScopeCapture::from_ivalue(ctx->saved_data["scopes"]));
    backward_thread = std::this_thread::get_id();
    CommTrace::record({Collective::kAllReduce, "probe", 4, "test"});
    return {grads[0]};
  }
};

TEST(ModulesOnCuda, BackwardOnTheDeviceThreadSeesTheBuildersScopes) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device (or this LibTorch has no CUDA)";
  CommTrace trace;
  const at::Tensor x = at::ones({4}, at::kCUDA).requires_grad_(true);
  RecordsInBackward::apply(x).sum().backward();
  EXPECT_NE(backward_thread, std::this_thread::get_id())
      << "the engine ran this CUDA backward on the calling thread";
  EXPECT_EQ(trace.count(Collective::kAllReduce, "probe"), 1) << trace.table();
}

// Which backend each of the module's calls gets with LibTorch's default switches, for the record
// (gpu-check.sh prints it): a causal call without a padding mask must not be sent as a bias
// tensor, which rules out flash and cuDNN.
TEST(ModulesOnCuda, CausalAttentionWithoutAPaddingMaskGetsAFusedKernel) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device (or this LibTorch has no CUDA)";
  at::Tensor q = randn({2, 2048, 32, 128}, 21).to(at::kCUDA, at::kBFloat16);
  at::Tensor k = randn({2, 2048, 32, 128}, 22).to(at::kCUDA, at::kBFloat16);
  at::Tensor kv8 = randn({2, 2048, 8, 128}, 23).to(at::kCUDA, at::kBFloat16);
  DotProductAttention causal(DotProductAttentionOptions(32, 128).attn_mask_type("causal"));
  DotProductAttention gqa(
      DotProductAttentionOptions(32, 128).num_gqa_groups(8).attn_mask_type("causal"));
  causal->eval();
  gqa->eval();
  const std::string b1 = causal->fused_backend(q, k, k), b2 = gqa->fused_backend(q, kv8, kv8);
  std::cout << "attention backend: causal bf16 [2, 2048, 32, 128]: " << b1
            << "; GQA 32/8 heads: " << b2 << std::endl;
  EXPECT_NE(b1, "math");
  EXPECT_NE(b1, "unfused");
}

}  // namespace
}  // namespace te::nn
