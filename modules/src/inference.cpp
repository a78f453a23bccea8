#include "te/nn/inference.h"

#include <ATen/ATen.h>

#include "te/error.h"
#include "te/fp8.h"
#include "te/kernels/ggml.h"
#include "te/nn/embedding.h"
#include "te/nn/sharded.h"

namespace te::nn {

namespace {

// Calls gemm(g) for each FP8-capable GEMM and table(embedding) for each Embedding of `root` not
// yet held in FP8, releasing each GEMM's fp32 kernel; returns how many were frozen. Every module
// is checked (check(g) for each GEMM) before anything changes, so a refusal leaves `root` whole.
template <typename CheckFn, typename GemmFn, typename TableFn>
int64_t for_each_weight(torch::nn::Module& root, const char* what, CheckFn check, GemmFn gemm,
                        TableFn table) {
  for (const auto& m : root.modules(/*include_self=*/true)) {
    auto* sharded = dynamic_cast<ShardedModule*>(m.get());
    if (sharded == nullptr) continue;
    TE_CHECK(!sharded->is_sharded(), what, ": ", m->name(),
             " holds sharded parameters; gather_module first (FP8 weights serve on one process)");
    for (const auto& [name, held] : sharded->all_held_blocks()) {
      TE_FAIL(what, ": '", name, "' of ", m->name(), " is held in GGUF ", held.matrix->type_names(),
              " blocks; load the model with te::hf::LoadOptions::dequantize_gguf = true to hold "
              "its weights in FP8 instead");
    }
    for (const ShardedModule::Fp8Gemm& g : sharded->fp8_gemms()) {
      if (g.meta != nullptr && !g.meta->frozen()) check(g);
    }
  }
  int64_t count = 0;
  for (const auto& m : root.modules(/*include_self=*/true)) {
    auto* sharded = dynamic_cast<ShardedModule*>(m.get());
    if (sharded == nullptr) continue;
    if (auto* embedding = dynamic_cast<EmbeddingImpl*>(m.get())) {
      if (table(*embedding)) ++count;
    }
    for (const ShardedModule::Fp8Gemm& g : sharded->fp8_gemms()) {
      if (g.meta == nullptr || g.meta->frozen()) continue;
      gemm(g);
      // The frozen codes become the module's buffers: saved, loaded and cloned with it.
      m->register_buffer(g.meta->prefix + "fp8_kernel", g.meta->frozen_kernel);
      m->register_buffer(g.meta->prefix + "fp8_kernel_scale_inv", g.meta->frozen_kernel_scale_inv);
      sharded->release_parameter(*m, g.kernel_name);
      ++count;
    }
  }
  return count;
}

}  // namespace

int64_t freeze_fp8_weights(torch::nn::Module& module) {
  return for_each_weight(
      module, "freeze_fp8_weights",
      [](const ShardedModule::Fp8Gemm& g) { fp8::check_freezable(*g.meta); },
      [](const ShardedModule::Fp8Gemm& g) { fp8::freeze_kernel(*g.meta, g.kernel); },
      [](EmbeddingImpl& e) { return e.freeze_fp8(); });
}

int64_t prepare_fp8_weights(torch::nn::Module& module) {
  return for_each_weight(
      module, "prepare_fp8_weights", [](const ShardedModule::Fp8Gemm&) {},
      [](const ShardedModule::Fp8Gemm& g) {
        fp8::prepare_frozen_kernel(*g.meta, g.kernel.sizes().vec());
      },
      [](EmbeddingImpl& e) { return e.freeze_fp8(/*empty=*/true); });
}

bool has_fp8_weights(const torch::nn::Module& module) {
  for (const auto& m : module.modules(/*include_self=*/true)) {
    if (const auto* e = dynamic_cast<const EmbeddingImpl*>(m.get()); e && e->fp8_frozen()) {
      return true;
    }
    auto* sharded = dynamic_cast<ShardedModule*>(m.get());
    if (sharded == nullptr) continue;
    for (const ShardedModule::Fp8Gemm& g : sharded->fp8_gemms()) {
      if (g.meta != nullptr && g.meta->frozen()) return true;
    }
  }
  return false;
}

bool has_block_weights(const torch::nn::Module& module) {
  for (const auto& m : module.modules(/*include_self=*/true)) {
    const auto* sharded = dynamic_cast<const ShardedModule*>(m.get());
    if (sharded != nullptr && !sharded->all_held_blocks().empty()) return true;
  }
  return false;
}

int64_t resident_bytes(const torch::nn::Module& module) {
  int64_t bytes = 0;
  for (const auto& p : module.parameters()) bytes += p.numel() * p.element_size();
  for (const auto& b : module.buffers()) bytes += b.numel() * b.element_size();
  for (const auto& m : module.modules(/*include_self=*/true)) {
    if (const auto* sharded = dynamic_cast<const ShardedModule*>(m.get())) {
      for (const auto& [name, held] : sharded->all_held_blocks()) bytes += held.matrix->bytes();
    }
  }
  return bytes;
}

}  // namespace te::nn
