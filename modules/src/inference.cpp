#include "te/nn/inference.h"

#include <ATen/ATen.h>

#include "te/error.h"
#include "te/fp8.h"
#include "te/nn/sharded.h"

namespace te::nn {

namespace {

template <typename Fn>
int64_t for_each_gemm(torch::nn::Module& root, const char* what, Fn fn) {
  int64_t count = 0;
  for (const auto& m : root.modules(/*include_self=*/true)) {
    auto* sharded = dynamic_cast<ShardedModule*>(m.get());
    if (sharded == nullptr) continue;
    TE_CHECK(!sharded->is_sharded(), what, ": ", m->name(),
             " holds sharded parameters; gather_module first (FP8 weights serve on one process)");
    for (const ShardedModule::Fp8Gemm& g : sharded->fp8_gemms()) {
      if (g.meta == nullptr || g.meta->frozen()) continue;
      fn(*sharded, *m, g);
      sharded->release_parameter(*m, g.kernel_name);
      *g.kernel = at::Tensor();
      ++count;
    }
  }
  return count;
}

}  // namespace

int64_t freeze_fp8_weights(torch::nn::Module& module) {
  return for_each_gemm(module, "freeze_fp8_weights",
                       [](ShardedModule&, torch::nn::Module&, const ShardedModule::Fp8Gemm& g) {
                         fp8::freeze_kernel(*g.meta, *g.kernel);
                       });
}

int64_t prepare_fp8_weights(torch::nn::Module& module) {
  return for_each_gemm(module, "prepare_fp8_weights",
                       [](ShardedModule&, torch::nn::Module&, const ShardedModule::Fp8Gemm& g) {
                         fp8::prepare_frozen_kernel(*g.meta, g.kernel->sizes().vec());
                       });
}

bool has_fp8_weights(const torch::nn::Module& module) {
  for (const auto& m : module.modules(/*include_self=*/true)) {
    auto* sharded = dynamic_cast<ShardedModule*>(m.get());
    if (sharded == nullptr) continue;
    for (const ShardedModule::Fp8Gemm& g : sharded->fp8_gemms()) {
      if (g.meta != nullptr && g.meta->frozen()) return true;
    }
  }
  return false;
}

}  // namespace te::nn
