// Fp8Autocast's regions, the FP8 state of a GEMM and its amax reductions (docs/ARCHITECTURE.md
// §5); the FP8 linear op is linear.cpp, each recipe's casts are in its own file (recipe_impl.h).

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <exception>
#include <mutex>

#include "recipe_impl.h"
#include "te/distributed/mesh.h"
#include "te/distributed/scopes.h"
#include "te/error.h"
#include "te/fp8.h"
#include "te/scope_stack.h"

namespace te::fp8 {

namespace {

// This thread's autocast regions, innermost last (te/scope_stack.h).
ScopeStack<std::shared_ptr<Region>>& region_stack() {
  thread_local ScopeStack<std::shared_ptr<Region>> stack;
  return stack;
}

}  // namespace

std::shared_ptr<Region> current_region() { return region_stack().top_or(nullptr); }

void keep_fp32(GemmMeta& meta) {
  for (at::Tensor* t : {&meta.fwd_scale, &meta.fwd_scale_inv, &meta.fwd_amax_history,
                        &meta.bwd_scale, &meta.bwd_scale_inv, &meta.bwd_amax_history}) {
    if (t->scalar_type() != at::kFloat) t->set_data(t->to(at::kFloat));
  }
}

at::Tensor reduced_amax(const at::Tensor& x, const GemmCall& call) {
  at::Tensor a = fp8::amax(x);
  if (call.mesh && !call.dims.empty()) a = call.mesh->all_reduce(a, ReduceOp::kMax, call.dims);
  return a;
}

void reduce_amaxes(std::vector<AmaxReduction>& items) {
  at::NoGradGuard no_grad;
  std::vector<bool> done(items.size(), false);
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (done[i] || !items[i].mesh || items[i].dims.empty()) continue;
    std::vector<std::size_t> group;
    std::vector<at::Tensor> parts;
    for (std::size_t j = i; j < items.size(); ++j) {
      if (!done[j] && items[j].mesh == items[i].mesh && items[j].dims == items[i].dims) {
        done[j] = true;
        group.push_back(j);
        parts.push_back(items[j].amax.reshape({-1}));
      }
    }
    const at::Tensor reduced =
        items[i].mesh->all_reduce(at::cat(parts), ReduceOp::kMax, items[i].dims);
    int64_t offset = 0;
    for (const std::size_t j : group) {
      const int64_t n = items[j].amax.numel();
      items[j].amax = reduced.narrow(0, offset, n).view(items[j].amax.sizes());
      offset += n;
    }
  }
}

std::shared_ptr<GemmMeta> GemmMeta::make(const std::string& prefix, int64_t history_len) {
  TE_CHECK(history_len >= 1, "GemmMeta: history_len is ", history_len, "; it needs at least 1");
  auto m = std::make_shared<GemmMeta>();
  m->prefix = prefix;
  m->fwd_scale = at::ones({2});
  m->fwd_scale_inv = at::ones({2});
  m->fwd_amax_history = at::zeros({history_len, 2});
  m->bwd_scale = at::ones({1});
  m->bwd_scale_inv = at::ones({1});
  m->bwd_amax_history = at::zeros({history_len, 1});
  return m;
}

bool records(const GemmMeta& meta) {
  const auto& region = current_region();
  if (region && region->calibrating) return true;
  if (c10::InferenceMode::is_enabled()) return false;
  return !meta.training || meta.training();
}

}  // namespace te::fp8

namespace te {

Fp8Autocast::Fp8Autocast(bool enabled, fp8::Recipe recipe,
                         std::optional<MeshResource> mesh_resource, bool calibrating) {
  if (mesh_resource) resource_scope_.emplace(*mesh_resource);
  auto region = std::make_shared<fp8::Region>();
  region->enabled = enabled;
  region->calibrating = calibrating;
  region->recipe = std::move(recipe);
  const std::shared_ptr<fp8::Region> outer = fp8::current_region();
  region->backward = outer ? outer->backward : std::make_shared<fp8::BackwardReduction>();
  fp8::region_stack().push(this, region);
  region_ = region;
  uncaught_ = std::uncaught_exceptions();
}

Fp8Autocast::~Fp8Autocast() noexcept(false) {
  const std::shared_ptr<fp8::Region>& region = region_;
  fp8::region_stack().pop(this);
  if (region->forward.empty()) return;
  // Unwinding: the other ranks may not reach their reduction; drop this step's amaxes.
  if (std::uncaught_exceptions() > uncaught_) return;
  // The innermost enclosing region that casts takes this one's amaxes; else they reduce now.
  const std::vector<std::shared_ptr<fp8::Region>> outer = fp8::region_stack().values();
  for (auto r = outer.rbegin(); r != outer.rend(); ++r) {
    if ((*r)->enabled || (*r)->calibrating) {
      for (auto& p : region->forward) fp8::add_pending((*r)->forward, std::move(p));
      return;
    }
  }
  fp8::reduce_and_update(region->forward, /*forward=*/true);
}

bool fp8_enabled() {
  const auto region = fp8::current_region();
  return region && region->enabled;
}

bool fp8_calibrating() {
  const auto region = fp8::current_region();
  return region && region->calibrating;
}

std::optional<fp8::Recipe> fp8_recipe() {
  const auto region = fp8::current_region();
  if (!region) return std::nullopt;
  return region->recipe;
}

}  // namespace te
