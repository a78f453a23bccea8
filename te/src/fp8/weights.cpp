// FP8 weights in training (TE's quantized_model_init with fp32 master weights): a GEMM's kernel
// held as E4M3 codes between optimizer steps, cast again from its master after each
// (docs/ARCHITECTURE.md §5). The GEMM that takes them is Fp8Linear (autocast.cpp); the modules
// side (which kernels, the amax reduction over their ranks, FSDP's gather of the codes) is
// te::nn::quantize_fp8_weights (modules/src/fp8_weights.cpp).

#include <ATen/ATen.h>

#include "recipe_impl.h"
#include "te/error.h"
#include "te/fp8.h"

namespace te::fp8 {

namespace {
[[noreturn]] void refuse(const RecipeImpl& recipe) {
  TE_FAIL("FP8 weights in training: ", recipe.to_string(),
          " scales blocks, so a weight held in FP8 would need a copy per GEMM layout; hold "
          "weights with a per-tensor recipe (delayed or current), or train this recipe with "
          "fp32 weights");
}
}  // namespace

ForwardCasts RecipeImpl::cast_input(const at::Tensor& /*x*/, GemmCall& /*call*/) const {
  refuse(*this);
}

at::Tensor RecipeImpl::weight_scale(const at::Tensor& /*amax*/) const { refuse(*this); }

void check_holdable(const Recipe& recipe) {
  // weight_scale of a zero amax: the per-tensor recipes answer, the others refuse.
  (void)recipe.impl().weight_scale(at::zeros({1}));
}

void check_holdable_kernel(const GemmMeta& meta, const at::Tensor& master) {
  TE_CHECK(!meta.frozen(), "FP8 weights in training: the GEMM '", meta.prefix,
           "kernel' holds frozen inference weights (freeze_fp8_weights); build or load the model "
           "with fp32 weights to train it");
  TE_CHECK(master.defined() && master.dim() >= 2 && master.is_floating_point(),
           "FP8 weights in training: the kernel '", meta.prefix,
           "kernel' is not a floating tensor of 2 or more dims");
  // The GEMMs check the master they are given against the one the codes were cast from; a
  // contiguous master reaches them as itself or a view of it, never as a copy.
  TE_CHECK(master.is_contiguous(), "FP8 weights in training: the kernel '", meta.prefix,
           "kernel' is not contiguous; make it contiguous (kernel.set_data(kernel.contiguous())) "
           "before holding it in FP8");
}

void hold_kernel(GemmMeta& meta, const at::Tensor& master, const at::Tensor& amax,
                 const Recipe& recipe) {
  check_holdable_kernel(meta, master);
  TE_CHECK(amax.defined() && amax.numel() == 1, "hold_kernel: '", meta.prefix,
           "kernel' needs the whole kernel's amax as one element, got ",
           amax.defined() ? amax.sizes() : at::IntArrayRef{});
  at::NoGradGuard no_grad;
  const at::Tensor scale = recipe.impl().weight_scale(amax.to(at::kFloat).reshape({1}));
  const DType dtype = forward_dtype(recipe.format());
  Fp8Tensor codes = quantize(master.detach().to(at::kFloat), scale, dtype);
  std::lock_guard<std::mutex> lock(meta.mutex);
  meta.held_kernel = std::move(codes);
  meta.held_from = {master.storage(), master.data_ptr(), static_cast<int64_t>(master._version())};
  meta.held_recipe = recipe;
}

void release_held_kernel(GemmMeta& meta) {
  std::lock_guard<std::mutex> lock(meta.mutex);
  meta.held_kernel = Fp8Tensor{};
  meta.held_from = GemmMeta::MasterStamp{};
  meta.held_recipe.reset();
}

}  // namespace te::fp8
