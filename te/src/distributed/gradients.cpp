#include "te/distributed/gradients.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "internal.h"
#include "te/error.h"

namespace te {

// The buckets' state is the hook the DTensor core hands deferred gradient sums to.
struct GradientBuckets::State : detail::GradientReductionHook {
  int64_t bucket_bytes = 0;
  // Per mesh row: the parameters whose gradients wait for its all-reduce. Rows and parameters
  // keep their order of arrival, which the same backward makes the same on every rank.
  std::vector<std::pair<const detail::Group*, std::vector<at::Tensor>>> waiting;
  std::vector<DeviceMesh> meshes;  // keep the groups alive
  bool finished = false;
  std::shared_ptr<detail::ThreadScopes> scopes;  // where the hook is installed
  // Autograd may run CPU and CUDA nodes of one backward on two threads at once.
  std::mutex mutex;

  bool defer(const at::Tensor& param, const DeviceMesh& mesh,
             const std::vector<int64_t>& mesh_dims) override {
    std::lock_guard<std::mutex> lock(mutex);
    for (int64_t m : mesh_dims) {
      const detail::Group* group = &mesh.state().groups[static_cast<std::size_t>(m)];
      auto row = std::find_if(waiting.begin(), waiting.end(),
                              [group](const auto& r) { return r.first == group; });
      if (row == waiting.end()) {
        waiting.emplace_back(group, std::vector<at::Tensor>{});
        row = std::prev(waiting.end());
      }
      auto& list = row->second;
      bool known = false;
      for (const at::Tensor& p : list) known = known || p.is_same(param);
      if (!known) list.push_back(param);
    }
    meshes.push_back(mesh);
    return true;
  }
};

GradientBuckets::GradientBuckets(int64_t bucket_bytes) : state_(std::make_unique<State>()) {
  TE_CHECK(bucket_bytes > 0, "GradientBuckets: bucket_bytes must be positive, got ", bucket_bytes);
  state_->bucket_bytes = bucket_bytes;
  state_->scopes = detail::install_gradient_hook(state_.get());
}

GradientBuckets::~GradientBuckets() {
  detail::remove_gradient_hook(*state_->scopes, state_.get());
  if (!state_->finished) {
    try {
      finish();
    } catch (...) {
    }
  }
}

int64_t GradientBuckets::pending() const {
  int64_t n = 0;
  for (const auto& [group, params] : state_->waiting) n += static_cast<int64_t>(params.size());
  return n;
}

void GradientBuckets::finish() {
  auto rows = std::move(state_->waiting);
  state_->waiting.clear();
  state_->finished = true;
  for (auto& [group, params] : rows) {
    for (const at::Tensor& p : params) {
      TE_CHECK(p.grad().defined(),
               "GradientBuckets: a deferred parameter has no gradient; call "
               "finish() after backward");
    }
    std::size_t i = 0;
    while (i < params.size()) {
      // One bucket: parameters of one dtype up to bucket_bytes (at least one).
      std::vector<at::Tensor> bucket;
      int64_t bytes = 0;
      const auto dtype = params[i].grad().scalar_type();
      while (
          i < params.size() && params[i].grad().scalar_type() == dtype &&
          (bucket.empty() || bytes + params[i].grad().numel() * params[i].grad().element_size() <=
                                 state_->bucket_bytes)) {
        bucket.push_back(params[i]);
        bytes += params[i].grad().numel() * static_cast<int64_t>(params[i].grad().element_size());
        ++i;
      }
      std::vector<at::Tensor> flat;
      for (const at::Tensor& p : bucket) flat.push_back(p.grad().reshape({-1}));
      const at::Tensor summed = detail::all_reduce(*group, at::cat(flat), ReduceOp::kSum);
      int64_t offset = 0;
      for (const at::Tensor& p : bucket) {
        const int64_t n = p.grad().numel();
        p.mutable_grad().copy_(summed.narrow(0, offset, n).view_as(p.grad()));
        offset += n;
      }
    }
  }
  state_->meshes.clear();
}

}  // namespace te
