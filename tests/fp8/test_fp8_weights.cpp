// FP8 weights in training (te::nn::quantize_fp8_weights, TE's quantized_model_init): held codes
// give the FP8 step that casts the kernels, bit for bit; stale codes, block recipes and frozen
// weights are refused; under FSDP2 the kernels' all-gathers move the codes (the analytic plan).

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "../distributed/dist_test_util.h"
#include "../expect_error.h"
#include "../nn/nn_test_util.h"
#include "../temp_dir.h"
#include "te/fp8.h"
#include "te/nn.h"

namespace te::nn {
namespace {

using test::randn;

TransformerLayer make_layer() {
  manual_seed(41);
  return TransformerLayer([&] {
    auto made = TransformerLayerOptions(64, 128, 4).hidden_dropout(0).intermediate_dropout(0);
    made.self_attention().attention().attention_dropout(0);
    return made;
  }());
}

void sgd(torch::nn::Module& m, double lr) {
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters()) {
    p.sub_(p.grad() * lr);
    p.mutable_grad() = at::Tensor();
  }
}

// One step's output and every parameter gradient.
struct Step {
  at::Tensor y;
  std::map<std::string, at::Tensor> grads;
};

Step step(TransformerLayer& layer, const fp8::Recipe& recipe, int i) {
  Step s;
  Fp8Autocast fp8(true, recipe);
  const at::Tensor y = layer(randn({2, 8, 64}, 50 + i));
  (y * randn({2, 8, 64}, 70 + i)).sum().backward();
  s.y = y.detach();
  for (const auto& p : layer->named_parameters()) s.grads[p.key()] = p.value().grad().clone();
  return s;
}

// CurrentScaling casts a kernel with the scale its own amax gives, which is what a held kernel
// is cast with: the held codes are the codes the step would cast, so every output and gradient
// is the same bits, step after step (the masters stepped, the codes requantized).
TEST(Fp8Weights, HeldKernelsGiveTheCastingStepBitForBit) {
  for (const fp8::Recipe& recipe :
       {fp8::Recipe(fp8::CurrentScaling{}),
        fp8::Recipe(fp8::CurrentScaling{fp8::Format::kHybrid, true, 1e-3f})}) {
    TransformerLayer cast = make_layer(), held = make_layer();
    EXPECT_EQ(quantize_fp8_weights(*held, recipe), 4);  // qkv, out, wi, wo
    // A quarter of fp32's bytes, plus one scale each.
    int64_t kernel_numel = 0;
    for (const auto& p : held->named_parameters()) {
      if (p.key().find("kernel") != std::string::npos) kernel_numel += p.value().numel();
    }
    EXPECT_EQ(held_fp8_weight_bytes(*held), kernel_numel + 4 * 4);
    for (int i = 0; i < 3; ++i) {
      const Step a = step(cast, recipe, i), b = step(held, recipe, i);
      EXPECT_TRUE(at::equal(a.y, b.y)) << recipe.to_string() << " step " << i;
      for (const auto& [name, g] : a.grads) {
        EXPECT_TRUE(at::equal(g, b.grads.at(name)))
            << recipe.to_string() << " step " << i << " " << name << " max diff "
            << (g - b.grads.at(name)).abs().max().item<double>();
      }
      sgd(*cast, 0.05);
      sgd(*held, 0.05);
      EXPECT_EQ(requantize_fp8_weights(*held), 4);
    }
  }
}

TEST(Fp8Weights, DelayedScalingHoldsKernelsCastWithTheirOwnAmax) {
  fp8::DelayedScaling recipe;
  recipe.amax_history_len = 4;
  recipe.margin = 1;
  TransformerLayer layer = make_layer();
  quantize_fp8_weights(*layer, recipe);
  const fp8::GemmMeta& meta = *layer->mlp->wi_fp8;
  const at::Tensor w = layer->mlp->wi_kernel.detach();
  // (448 / amax) / 2^margin, the kernel's own amax.
  const float scale = (448.0f / w.abs().max().item<float>()) / 2.0f;
  EXPECT_FLOAT_EQ(meta.held_kernel.scale_inv.item<float>(), 1.0f / scale);
  EXPECT_TRUE(at::equal(meta.held_kernel.data,
                        fp8::quantize(w, at::full({1}, scale), fp8::DType::kE4M3).data));
  // The step runs and records the inputs' amaxes (the kernel's slot stays unused).
  const Step s = step(layer, recipe, 0);
  EXPECT_TRUE(at::isfinite(s.y).all().item<bool>());
  EXPECT_GT(meta.fwd_amax_history[3][0].item<float>(), 0.0f);  // rolled at the region's end
  EXPECT_EQ(meta.fwd_amax_history[3][1].item<float>(), 0.0f);
}

TEST(Fp8Weights, AKernelChangedSinceItsCastIsRefusedUntilRequantized) {
  TransformerLayer layer = make_layer();
  const fp8::CurrentScaling recipe;
  quantize_fp8_weights(*layer, recipe);
  step(layer, recipe, 0);
  sgd(*layer, 0.05);  // the optimizer step, without requantize_fp8_weights
  EXPECT_ERROR(step(layer, recipe, 1), "qkv_kernel' changed since its FP8 codes were cast");
  EXPECT_ERROR(step(layer, recipe, 1), "requantize_fp8_weights(model) after each optimizer.step()");
  requantize_fp8_weights(*layer);
  step(layer, recipe, 1);
  // A load replaces the master's storage: refused the same way.
  {
    at::NoGradGuard no_grad;
    layer->mlp->wo_kernel.set_data(layer->mlp->wo_kernel.clone());
  }
  EXPECT_ERROR(step(layer, recipe, 2), "wo_kernel' changed");
  requantize_fp8_weights(*layer);
  step(layer, recipe, 2);
  // Outside an FP8 region the GEMMs use the masters, whatever the codes.
  sgd(*layer, 0.05);
  TransformerLayer plain = make_layer();
  for (const auto& p : plain->named_parameters()) {
    at::NoGradGuard no_grad;
    p.value().copy_(layer->named_parameters()[p.key()]);
  }
  const at::Tensor x = randn({2, 8, 64}, 9);
  EXPECT_TRUE(at::equal(layer(x), plain(x)));
  // Released: the GEMMs cast their kernels again.
  EXPECT_EQ(release_fp8_weights(*layer), 4);
  EXPECT_EQ(held_fp8_weight_bytes(*layer), 0);
  step(layer, recipe, 3);
}

// Checkpoints save the fp32 masters (the codes are derived): a model loaded from one and held
// again has the same codes and trains on bit for bit.
TEST(Fp8Weights, CheckpointsSaveTheMastersAndALoadedModelHoldsTheSameCodes) {
  const fp8::CurrentScaling recipe;
  TransformerLayer a = make_layer();
  quantize_fp8_weights(*a, recipe);
  step(a, recipe, 0);
  sgd(*a, 0.05);
  requantize_fp8_weights(*a);
  te::test::TempDir dir;
  save_checkpoint(*a, dir.path().string());
  manual_seed(99);  // other initial weights
  TransformerLayer b([&] {
    auto made = TransformerLayerOptions(64, 128, 4).hidden_dropout(0).intermediate_dropout(0);
    made.self_attention().attention().attention_dropout(0);
    return made;
  }());
  quantize_fp8_weights(*b, recipe);
  load_checkpoint(*b, dir.path().string());
  for (const auto& p : a->named_parameters()) {
    EXPECT_EQ(p.value().scalar_type(), at::kFloat) << p.key();
    EXPECT_TRUE(at::equal(p.value(), b->named_parameters()[p.key()])) << p.key();
  }
  // The load replaced the masters: b's old codes are refused until held again.
  EXPECT_ERROR(step(b, recipe, 1), "changed since its FP8 codes were cast");
  requantize_fp8_weights(*b);
  for (const auto& [name, gemm] :
       std::vector<std::pair<std::string, std::pair<fp8::GemmMeta*, fp8::GemmMeta*>>>{
           {"qkv", {a->self_attention->qkv_fp8.get(), b->self_attention->qkv_fp8.get()}},
           {"wo", {a->mlp->wo_fp8.get(), b->mlp->wo_fp8.get()}}}) {
    EXPECT_TRUE(at::equal(gemm.first->held_kernel.data, gemm.second->held_kernel.data)) << name;
    EXPECT_TRUE(at::equal(gemm.first->held_kernel.scale_inv, gemm.second->held_kernel.scale_inv))
        << name;
  }
  const Step sa = step(a, recipe, 1), sb = step(b, recipe, 1);
  EXPECT_TRUE(at::equal(sa.y, sb.y));
}

TEST(Fp8Weights, BlockRecipesAndFrozenWeightsAreRefusedAndNothingChanges) {
  TransformerLayer layer = make_layer();
  EXPECT_ERROR(quantize_fp8_weights(*layer, fp8::Float8BlockScaling{}), "Float8BlockScaling");
  EXPECT_ERROR(quantize_fp8_weights(*layer, fp8::Float8BlockScaling{}),
               "per-tensor recipe (delayed or current)");
  EXPECT_ERROR(quantize_fp8_weights(*layer, fp8::MXFP8BlockScaling{}), "MXFP8BlockScaling");
  EXPECT_ERROR(quantize_fp8_weights(*layer, fp8::NVFP4BlockScaling{}), "NVFP4BlockScaling");
  EXPECT_EQ(held_fp8_weight_bytes(*layer), 0);
  // Held under current scaling, then stepped under a block recipe: the block recipe refuses.
  quantize_fp8_weights(*layer, fp8::CurrentScaling{});
  EXPECT_ERROR(step(layer, fp8::MXFP8BlockScaling{}, 0),
               "the GEMM 'qkv_kernel' holds codes cast under CurrentScaling(format=HYBRID) but "
               "the autocast runs MXFP8BlockScaling(");
  // Another per-tensor recipe is refused too (the codes carry the held recipe's scale rule).
  EXPECT_ERROR(step(layer, fp8::DelayedScaling{}, 0), "release_fp8_weights(model)");
  // A non-contiguous kernel is refused before anything is held.
  Dense dense(DenseOptions(16, 8));
  {
    at::NoGradGuard no_grad;
    dense->kernel.set_data(randn({8, 16}, 4).t());
  }
  EXPECT_ERROR(quantize_fp8_weights(*dense, fp8::CurrentScaling{}),
               "the kernel 'kernel' is not contiguous");
  EXPECT_EQ(held_fp8_weight_bytes(*dense), 0);
  // Frozen inference weights cannot be trained.
  TransformerLayer frozen = make_layer();
  {
    Fp8Autocast calibrate(false, fp8::DelayedScaling{}, std::nullopt, /*calibrating=*/true);
    frozen(randn({2, 8, 64}, 3));
  }
  freeze_fp8_weights(*frozen);
  // The fp32 kernels are gone from the modules' members too, not only from their parameters.
  for (const at::Tensor& k : {frozen->self_attention->out_kernel, frozen->mlp->wi_kernel,
                              frozen->mlp->wo_kernel}) {
    EXPECT_FALSE(k.defined());
  }
  EXPECT_ERROR(quantize_fp8_weights(*frozen, fp8::CurrentScaling{}),
               "holds frozen inference weights");
}

// FSDP2: one training step's all-gathers with held FP8 kernels against the same step in fp32.
// Each kernel is gathered for forward and again for backward; held, it moves as uint8 codes, so
// the gathers carry 2 x (4 - 1) bytes less per kernel element (a quarter of fp32's kernel bytes;
// the scale is the same on every rank and is not gathered); nothing else changes. requantize is
// one all-reduce of the kernels' amaxes. (In the Fp8Parallel suite: thread ranks need Gloo, which
// a CUDA LibTorch wheel's build lacks; scripts/gpu-check.sh leaves that suite out there.)
TEST(Fp8Parallel, FsdpGathersHeldFp8CodesAQuarterOfFp32sBytes) {
  const std::vector<int64_t> shape = {4, 6, 32};
  set_warning_handler([](std::string_view) {});
  run_local_ranks(2, [&](int rank) {
    DeviceMesh mesh({2}, {"data"});
    MeshScope mesh_scope(mesh);
    const MeshResource resource = parse_mesh_resource("fsdp=data");
    auto gathers = [&](bool held, int64_t* kernel_numel) {
      LayerNormMLP mlp = [&] {
        MeshResourceScope scope(resource);
        manual_seed(31);
        return LayerNormMLP(
            LayerNormMLPOptions(32, 64).activations({"gelu"}).intermediate_dropout_rate(0));
      }();
      *kernel_numel = 0;
      for (const auto& [name, layout] : named_parameter_layouts(*mlp)) {
        if (name.find("kernel") == std::string::npos) continue;
        int64_t n = 1;
        for (const int64_t d : layout.global_shape) n *= d;
        *kernel_numel += n;
        EXPECT_TRUE(is_shard(layout.placements[0])) << name << " is not FSDP-sharded";
      }
      if (held) quantize_fp8_weights(*mlp, fp8::CurrentScaling{});
      MeshResourceScope scope(resource);
      const auto placements =
          placements_for(*resolve_logical_axes({"batch", "seqlen", "hidden"}), mesh);
      const DTensor x = DTensor::from_local(
          te::test::piece_of(randn(shape, 5), mesh, placements, rank), mesh, placements, shape);
      CommTrace trace;
      {
        std::optional<Fp8Autocast> fp8;
        if (held) fp8.emplace(true, fp8::CurrentScaling{}, resource);
        mlp(x).full_tensor().sum().backward();
      }
      std::pair<int64_t, int64_t> out{trace.count(Collective::kAllGather),
                                      trace.bytes(Collective::kAllGather)};
      if (held) {
        CommTrace requantize;
        sgd(*mlp, 0.1);
        EXPECT_EQ(requantize_fp8_weights(*mlp), 2);
        EXPECT_EQ(requantize.total_count(), 1) << requantize.table();
        EXPECT_EQ(requantize.bytes(Collective::kAllReduce, "data"), 2 * 4);
      }
      return out;
    };
    int64_t numel = 0;
    const auto fp32 = gathers(false, &numel);
    const auto held = gathers(true, &numel);
    EXPECT_EQ(held.first, fp32.first);
    EXPECT_EQ(fp32.second - held.second, 2 * (4 - 1) * numel)
        << "fp32 " << fp32.second << " bytes, held FP8 " << held.second << " bytes, kernels "
        << numel << " elements";
  });
  set_warning_handler(nullptr);
}

}  // namespace
}  // namespace te::nn
