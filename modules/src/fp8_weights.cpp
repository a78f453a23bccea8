#include "te/nn/fp8_weights.h"

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "te/error.h"
#include "te/nn/sharded.h"

namespace te::nn {

namespace {

struct Held {
  ShardedModule::Fp8Gemm gemm;
  const ParameterLayout* layout = nullptr;
};

// Every FP8-capable GEMM of `root` for which keep(gemm) holds, with its kernel's layout.
template <typename Keep>
std::vector<Held> gemms_of(torch::nn::Module& root, Keep keep) {
  std::vector<Held> out;
  for (const auto& m : root.modules(/*include_self=*/true)) {
    auto* sharded = dynamic_cast<ShardedModule*>(m.get());
    if (sharded == nullptr) continue;
    for (const ShardedModule::Fp8Gemm& g : sharded->fp8_gemms()) {
      if (g.meta == nullptr || !keep(g)) continue;
      const auto& layouts = sharded->parameter_layouts();
      const auto it = layouts.find(g.kernel_name);
      out.push_back({g, it == layouts.end() ? nullptr : &it->second});
    }
  }
  return out;
}

// Casts each kernel with the scale its whole amax gives: the amaxes of the kernels sharded over
// the same mesh dims reduced in one all-reduce (MAX). Only the dims a kernel is sharded over take
// part (its copies along the others are equal), so a pipeline axis, along which stages hold
// different kernels, never does.
void hold(const std::vector<Held>& items, const std::vector<fp8::Recipe>& recipes) {
  at::NoGradGuard no_grad;
  std::vector<fp8::AmaxReduction> amaxes;
  for (const Held& h : items) {
    fp8::AmaxReduction a{fp8::amax(h.gemm.kernel.detach()), std::nullopt, {}};
    const ParameterLayout* layout = h.layout;
    if (layout != nullptr && layout->mesh) {
      for (std::size_t d = 0; d < layout->placements.size(); ++d) {
        if (is_shard(layout->placements[d]) && layout->mesh->size(static_cast<int64_t>(d)) > 1) {
          a.dims.push_back(static_cast<int64_t>(d));
        }
      }
      // Whole on every rank (no dims): its own amax is the kernel's.
      if (!a.dims.empty()) a.mesh = layout->mesh;
    }
    amaxes.push_back(std::move(a));
  }
  fp8::reduce_amaxes(amaxes);
  for (std::size_t i = 0; i < items.size(); ++i) {
    fp8::hold_kernel(*items[i].gemm.meta, items[i].gemm.kernel, amaxes[i].amax, recipes[i]);
  }
}

}  // namespace

int64_t quantize_fp8_weights(torch::nn::Module& module, const fp8::Recipe& recipe) {
  fp8::check_holdable(recipe);
  const std::vector<Held> items =
      gemms_of(module, [](const ShardedModule::Fp8Gemm&) { return true; });
  // Every GEMM checked before any changes.
  for (const Held& h : items) fp8::check_holdable_kernel(*h.gemm.meta, h.gemm.kernel);
  hold(items, std::vector<fp8::Recipe>(items.size(), recipe));
  return static_cast<int64_t>(items.size());
}

int64_t requantize_fp8_weights(torch::nn::Module& module) {
  const std::vector<Held> items =
      gemms_of(module, [](const ShardedModule::Fp8Gemm& g) { return g.meta->holds_kernel(); });
  std::vector<fp8::Recipe> recipes;
  for (const Held& h : items) recipes.push_back(*h.gemm.meta->held_recipe);
  hold(items, recipes);
  return static_cast<int64_t>(items.size());
}

int64_t release_fp8_weights(torch::nn::Module& module) {
  const std::vector<Held> items =
      gemms_of(module, [](const ShardedModule::Fp8Gemm& g) { return g.meta->holds_kernel(); });
  for (const Held& h : items) fp8::release_held_kernel(*h.gemm.meta);
  return static_cast<int64_t>(items.size());
}

int64_t held_fp8_weight_bytes(const torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const Held& h :
       gemms_of(const_cast<torch::nn::Module&>(module),
                [](const ShardedModule::Fp8Gemm& g) { return g.meta->holds_kernel(); })) {
    const fp8::Fp8Tensor& t = h.gemm.meta->held_kernel;
    bytes += static_cast<int64_t>(t.data.nbytes() + t.scale_inv.nbytes());
  }
  return bytes;
}

}  // namespace te::nn
