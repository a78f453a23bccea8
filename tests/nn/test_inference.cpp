// Serving: one shared module called from many threads at once, each under its own scopes, must
// give exactly the results of the same calls made one after another; FP8 outside training uses
// the stored scales and records nothing; FP8 weights (freeze_fp8_weights) compute what the FP8
// autocast path computes, save and load as FP8, and refuse misuse.
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../expect_error.h"
#include "../temp_dir.h"
#include "te/nn.h"

namespace {

using namespace te;
using namespace te::nn;

constexpr int kThreads = 32;

at::Tensor randn(std::vector<int64_t> shape, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  return at::randn(shape, gen);
}

TransformerLayer shared_layer() {
  manual_seed(7);
  TransformerLayer layer([&] {
    auto made = TransformerLayerOptions(64, 128, 4).hidden_dropout(0.1).intermediate_dropout(0.1);
    made.self_attention().attention().attention_dropout(0.1);
    return made;
  }());
  layer->eval();
  return layer;
}

// Every module buffer and parameter, copied.
std::vector<at::Tensor> snapshot(const torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  for (const auto& b : m.buffers()) out.push_back(b.clone());
  return out;
}

void expect_unchanged(const std::vector<at::Tensor>& before, const torch::nn::Module& m) {
  const auto after = snapshot(m);
  ASSERT_EQ(before.size(), after.size());
  for (std::size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(at::equal(before[i], after[i])) << "tensor " << i << " of the module changed";
  }
}

// Runs fn(i) for every i on its own thread, all at once.
template <typename Fn>
void on_threads(Fn fn) {
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back([&fn, i] { fn(i); });
  for (auto& t : threads) t.join();
}

// The scopes thread i opens: rules, a MeshResource and a one-rank mesh whose axis names are its
// own, so a thread that saw another's scopes would fail or differ.
struct ThreadScopes {
  explicit ThreadScopes(int i)
      : name("axis" + std::to_string(i)),
        mesh({1}, {name}),
        mesh_scope(mesh),
        resource_scope(parse_mesh_resource("dp=" + name)),
        rules_scope(AxisRules{{"batch", {name}}, {"heads", {name}}, {"mlp", {name}}}) {}
  std::string name;
  DeviceMesh mesh;
  MeshScope mesh_scope;
  MeshResourceScope resource_scope;
  AxisRulesScope rules_scope;
};

TEST(SharedModule, ThirtyTwoThreadsUnderTheirOwnScopesGetTheSequentialResults) {
  TransformerLayer layer = shared_layer();
  std::vector<at::Tensor> inputs, expected(kThreads), expected_dt(kThreads);
  for (int i = 0; i < kThreads; ++i) inputs.push_back(randn({2, 8, 64}, 100 + i));
  for (int i = 0; i < kThreads; ++i) {
    ThreadScopes scopes(i);
    expected[i] = layer(inputs[i]);
    const DTensor x = DTensor::from_local(inputs[i], scopes.mesh, {Replicate{}});
    expected_dt[i] = layer(x).full_tensor();
  }
  const auto before = snapshot(*layer);
  std::vector<at::Tensor> got(kThreads), got_dt(kThreads);
  std::vector<std::string> rules_seen(kThreads);
  on_threads([&](int i) {
    ThreadScopes scopes(i);
    got[i] = layer(inputs[i]);
    got_dt[i] = layer(DTensor::from_local(inputs[i], scopes.mesh, {Replicate{}})).full_tensor();
    rules_seen[i] = to_string(*resolve_logical_axes({"batch", std::nullopt}));
  });
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_TRUE(at::equal(got[i], expected[i])) << "thread " << i;
    EXPECT_TRUE(at::equal(got_dt[i], expected_dt[i])) << "thread " << i << " (DTensor)";
    EXPECT_EQ(rules_seen[i], "PartitionSpec('axis" + std::to_string(i) + "', None)");
  }
  expect_unchanged(before, *layer);
}

// Every te::nn module, shared by 32 threads: even threads under their own rules, odd ones under a
// MeshResource alone (Transformer Engine's table, the deprecated fallback that warns once).
TEST(SharedModule, EveryModuleTypeIsSafeToCallFromManyThreads) {
  manual_seed(11);
  Dense dense(DenseOptions(64, 96).input_axes({"batch", "seqlen", "hidden"}));
  LayerNormDense ln_dense(64, 96);
  LayerNormMLP mlp(LayerNormMLPOptions(64, 128).activations({"gelu", "linear"}));
  MultiHeadAttention mha(64, 4);
  TransformerLayer decoder([&] {
    auto made = TransformerLayerOptions(64, 128, 4).layer_type("decoder");
    made.self_attention().attention().attn_mask_type("causal");
    return made;
  }());
  std::vector<std::pair<std::string, std::function<at::Tensor(const at::Tensor&)>>> modules = {
      {"Dense", [&](const at::Tensor& x) { return dense(x); }},
      {"LayerNormDense", [&](const at::Tensor& x) { return ln_dense(x); }},
      {"LayerNormMLP", [&](const at::Tensor& x) { return mlp(x); }},
      {"MultiHeadAttention", [&](const at::Tensor& x) { return mha(x); }},
      {"TransformerLayer(decoder)", [&](const at::Tensor& x) {
         return decoder(x, at::Tensor(), x, at::zeros({2, 1, 8, 8}, at::kBool));
       }}};
  for (torch::nn::Module* m :
       {static_cast<torch::nn::Module*>(dense.get()),
        static_cast<torch::nn::Module*>(ln_dense.get()), static_cast<torch::nn::Module*>(mlp.get()),
        static_cast<torch::nn::Module*>(mha.get()),
        static_cast<torch::nn::Module*>(decoder.get())}) {
    m->eval();
  }
  reset_deprecation_warnings();
  std::atomic<int> warnings{0};
  const WarningHandler previous = set_warning_handler([&](std::string_view) { ++warnings; });
  auto scoped = [](int i, const std::function<at::Tensor()>& fn) {
    const std::string name = "axis" + std::to_string(i);
    DeviceMesh mesh({1}, {name});
    MeshScope mesh_scope(mesh);
    if (i % 2 == 0) {
      AxisRulesScope rules(AxisRules{{"batch", {name}}, {"hidden", {name}}});
      return fn();
    }
    MeshResourceScope resource(parse_mesh_resource("dp=" + name));
    return fn();
  };
  for (const auto& [what, forward] : modules) {
    std::vector<at::Tensor> inputs, expected(kThreads), got(kThreads);
    for (int i = 0; i < kThreads; ++i) inputs.push_back(randn({2, 8, 64}, 400 + i));
    // Sequentially in the threads' mode: without an autograd graph the fp32 GEMMs run on oneDNN
    // (te::nn::cpu_gemm_library), whose sums differ from LibTorch's in the last bits.
    for (int i = 0; i < kThreads; ++i) {
      c10::InferenceMode inference;
      expected[i] = scoped(i, [&, i] { return forward(inputs[i]); });
    }
    on_threads([&](int i) {
      c10::InferenceMode inference;
      got[i] = scoped(i, [&, i] { return forward(inputs[i]); });
    });
    for (int i = 0; i < kThreads; ++i) {
      EXPECT_TRUE(at::equal(got[i], expected[i]))
          << what << ", thread " << i << ": largest difference "
          << (got[i] - expected[i]).abs().max().item<float>();
    }
  }
  set_warning_handler(previous);
  EXPECT_EQ(warnings.load(), 1);  // the fallback warns once per process, whatever the threads
}

TEST(SharedModule, Fp8DelayedScalingUnderInferenceModeGetsTheSequentialResults) {
  TransformerLayer layer = shared_layer();
  // Scales as training leaves them.
  layer->train();
  fp8::DelayedScaling recipe;
  recipe.amax_history_len = 4;
  for (int step = 0; step < 2; ++step) {
    Fp8Autocast fp8(true, recipe);
    layer(randn({2, 8, 64}, 5 + step)).sum().backward();
  }
  layer->eval();
  std::vector<at::Tensor> inputs, expected(kThreads);
  // Inputs of very different magnitudes: recording their amaxes would move the scales.
  for (int i = 0; i < kThreads; ++i) inputs.push_back(randn({2, 8, 64}, 200 + i) * (1 + i));
  const auto before = snapshot(*layer);
  for (int i = 0; i < kThreads; ++i) {
    c10::InferenceMode inference;
    Fp8Autocast fp8(true, recipe);
    expected[i] = layer(inputs[i]);
  }
  expect_unchanged(before, *layer);
  std::vector<at::Tensor> got(kThreads);
  on_threads([&](int i) {
    c10::InferenceMode inference;
    ThreadScopes scopes(i);
    Fp8Autocast fp8(true, recipe);
    got[i] = layer(inputs[i]);
  });
  for (int i = 0; i < kThreads; ++i) EXPECT_TRUE(at::equal(got[i], expected[i])) << "thread " << i;
  expect_unchanged(before, *layer);
  // And the FP8 path really ran: the results differ from fp32.
  c10::InferenceMode inference;
  EXPECT_FALSE(at::equal(layer(inputs[0]), expected[0]));
}

TEST(Fp8Inference, EvalModeRecordsNothingAndTrainingStillDoes) {
  manual_seed(3);
  Dense dense(32, 16);
  const at::Tensor x = randn({4, 32}, 9);
  dense->eval();
  {
    Fp8Autocast fp8(true);
    dense(x);  // grad mode on, eval mode: nothing recorded
  }
  EXPECT_EQ(dense->fp8_meta->fwd_amax_history.abs().sum().item<float>(), 0.0f);
  EXPECT_EQ(dense->fp8_meta->fwd_scale[0].item<float>(), 1.0f);
  dense->train();
  {
    c10::InferenceMode inference;  // InferenceMode: nothing recorded even in training mode
    Fp8Autocast fp8(true);
    dense(x);
  }
  EXPECT_EQ(dense->fp8_meta->fwd_amax_history.abs().sum().item<float>(), 0.0f);
  {
    Fp8Autocast fp8(true);
    dense(x);
  }
  EXPECT_GT(dense->fp8_meta->fwd_amax_history.abs().sum().item<float>(), 0.0f);
  EXPECT_NE(dense->fp8_meta->fwd_scale[0].item<float>(), 1.0f);
}

TEST(Fp8Inference, CalibrationRecordsInEvalModeAndKeepsTheOutputInHighPrecision) {
  manual_seed(3);
  Dense dense(32, 16);
  dense->eval();
  const at::Tensor x = randn({4, 32}, 9) * 3;
  const at::Tensor ref = dense(x);
  at::Tensor y;
  {
    c10::InferenceMode inference;
    Fp8Autocast calibrate(false, fp8::DelayedScaling{}, std::nullopt, /*calibrating=*/true);
    EXPECT_TRUE(fp8_calibrating());
    EXPECT_FALSE(fp8_enabled());
    y = dense(x);
  }
  EXPECT_TRUE(at::equal(y, ref));  // high precision while calibrating
  const float x_amax = x.abs().max().item<float>();
  const float w_amax = dense->kernel.abs().max().item<float>();
  EXPECT_FLOAT_EQ(dense->fp8_meta->fwd_scale[0].item<float>(), 448.0f / x_amax);
  EXPECT_FLOAT_EQ(dense->fp8_meta->fwd_scale[1].item<float>(), 448.0f / w_amax);
  // An fp16 model calibrates too (its GEMM widened on the CPU), and the scales stay fp32.
  Dense half(32, 16);
  half->to(at::kHalf);
  half->eval();
  {
    Fp8Autocast calibrate(false, fp8::DelayedScaling{}, std::nullopt, /*calibrating=*/true);
    torch::NoGradGuard no_grad;
    EXPECT_EQ(half(x.to(at::kHalf)).scalar_type(), at::kHalf);
  }
  EXPECT_EQ(half->fp8_meta->fwd_scale.scalar_type(), at::kFloat);
  EXPECT_NE(half->fp8_meta->fwd_scale[0].item<float>(), 1.0f);
}

// A TransformerLayer with calibrated scales, and the same inputs.
struct Calibrated {
  Calibrated() : layer(shared_layer()) {
    for (int i = 0; i < 4; ++i) inputs.push_back(randn({3, 8, 64}, 300 + i));
    c10::InferenceMode inference;
    Fp8Autocast calibrate(false, fp8::DelayedScaling{}, std::nullopt, /*calibrating=*/true);
    for (const auto& x : inputs) layer(x);
  }
  TransformerLayer layer;
  std::vector<at::Tensor> inputs;
};

TEST(Fp8Weights, FrozenKernelsComputeWhatTheFp8AutocastPathComputesAtAQuarterOfTheBytes) {
  Calibrated c;
  std::vector<at::Tensor> autocast;
  for (const auto& x : c.inputs) {
    c10::InferenceMode inference;
    Fp8Autocast fp8(true);  // HYBRID: E4M3 forward, the stored scales
    autocast.push_back(c.layer(x));
  }
  auto kernel_bytes = [](const torch::nn::Module& m) {
    int64_t bytes = 0;
    for (const auto& p : m.named_parameters()) {
      if (p.key().find("kernel") != std::string::npos) bytes += p.value().nbytes();
    }
    for (const auto& b : m.named_buffers()) {
      if (b.key().find("fp8_kernel") != std::string::npos && b.value().scalar_type() == at::kByte)
        bytes += b.value().nbytes();
    }
    return bytes;
  };
  const int64_t fp32_bytes = kernel_bytes(*c.layer);
  EXPECT_EQ(freeze_fp8_weights(*c.layer), 4);  // qkv, out, wi, wo
  EXPECT_TRUE(has_fp8_weights(*c.layer));
  EXPECT_EQ(kernel_bytes(*c.layer) * 4, fp32_bytes);
  for (const auto& p : c.layer->named_parameters()) {
    EXPECT_EQ(p.key().find("kernel"), std::string::npos) << p.key() << " was kept in fp32";
  }
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    c10::InferenceMode inference;
    EXPECT_TRUE(at::equal(c.layer(c.inputs[i]), autocast[i])) << "input " << i;
  }
  EXPECT_EQ(freeze_fp8_weights(*c.layer), 0);  // already frozen
}

TEST(Fp8Weights, SaveAndLoadAsFp8) {
  Calibrated c;
  freeze_fp8_weights(*c.layer);
  te::test::TempDir dir;
  save_checkpoint(*c.layer, (dir.path() / "fp8").string());
  const CheckpointInfo info = read_checkpoint_info((dir.path() / "fp8").string());
  EXPECT_NE(std::find(info.tensors.begin(), info.tensors.end(), "mlp.wi_fp8_kernel"),
            info.tensors.end());
  EXPECT_GT(info.bytes, 0);

  manual_seed(99);  // other weights: the load must replace them
  TransformerLayer fresh(TransformerLayerOptions(64, 128, 4));
  fresh->eval();
  EXPECT_EQ(prepare_fp8_weights(*fresh), 4);
  load_checkpoint(*fresh, (dir.path() / "fp8").string());
  c10::InferenceMode inference;
  for (const auto& x : c.inputs) EXPECT_TRUE(at::equal(fresh(x), c.layer(x)));
}

TEST(Fp8Weights, MisuseIsNamed) {
  manual_seed(3);
  Dense dense(32, 16);
  EXPECT_ERROR(freeze_fp8_weights(*dense), "buffer 'fp8_fwd_amax_history' holds no amax");
  {
    Fp8Autocast calibrate(false, fp8::DelayedScaling{}, std::nullopt, true);
    torch::NoGradGuard no_grad;
    dense(randn({4, 32}, 1));
  }
  freeze_fp8_weights(*dense);
  const at::Tensor x = randn({4, 32}, 2).requires_grad_(true);
  EXPECT_ERROR(dense(x), "'kernel' holds FP8 weights (inference only) but its input requires grad");
  DeviceMesh mesh({1}, {"dp"});
  EXPECT_ERROR(dense(DTensor::from_local(x.detach(), mesh, {Replicate{}})),
               "parameter 'kernel' was released");
  EXPECT_ERROR(read_checkpoint_info("/nonexistent/te-ckpt"),
               "no checkpoint at '/nonexistent/te-ckpt'");
}

}  // namespace
