#include "te/distributed/gradients.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "internal.h"
#include "te/error.h"

namespace te {

// The buckets' state is the hook the DTensor core hands deferred gradient sums to. It keeps
// each parameter's deferred contributions apart from its .grad(), so a parameter that also
// gets gradient another way (a tied weight, accumulation over micro-batches) has only the
// deferred part summed over the rows.
struct GradientBuckets::State : detail::GradientReductionHook {
  int64_t bucket_bytes = 0;
  struct Deferred {
    at::Tensor param, grad;          // grad: the sum of this backward's deferred contributions
    std::vector<int64_t> mesh_dims;  // the rows it is summed over (one entry per set)
  };
  std::vector<Deferred> deferred;  // in order of arrival, the same on every rank
  // Per mesh row: indices into `deferred` whose sums wait for its all-reduce. Rows keep their
  // order of arrival, which the same backward makes the same on every rank.
  std::vector<std::pair<const detail::Group*, std::vector<std::size_t>>> waiting;
  std::vector<DeviceMesh> meshes;  // keep the groups alive
  bool finished = false;
  std::shared_ptr<detail::ThreadScopes> scopes;  // where the hook is installed
  // Autograd may run CPU and CUDA nodes of one backward on two threads at once.
  std::mutex mutex;

  bool defer(const at::Tensor& param, const DeviceMesh& mesh, const std::vector<int64_t>& mesh_dims,
             const at::Tensor& grad) override {
    std::lock_guard<std::mutex> lock(mutex);
    // After finish() nothing would run these sums: the core reduces them itself.
    if (finished) return false;
    // One entry per parameter and set of rows: contributions summed over other rows (a tied
    // use under another layout) are summed apart.
    auto it = std::find_if(deferred.begin(), deferred.end(), [&](const Deferred& d) {
      return d.param.is_same(param) && d.mesh_dims == mesh_dims;
    });
    // Out of place: autograd may hand the same gradient tensor to other inputs.
    if (it == deferred.end()) {
      deferred.push_back({param, grad.detach(), mesh_dims});
      it = std::prev(deferred.end());
    } else {
      it->grad = it->grad + grad.detach();
    }
    const std::size_t index = static_cast<std::size_t>(it - deferred.begin());
    for (int64_t m : mesh_dims) {
      const detail::Group* group = &mesh.state().groups[static_cast<std::size_t>(m)];
      auto row = std::find_if(waiting.begin(), waiting.end(),
                              [group](const auto& r) { return r.first == group; });
      if (row == waiting.end()) {
        waiting.emplace_back(group, std::vector<std::size_t>{});
        row = std::prev(waiting.end());
      }
      auto& list = row->second;
      if (std::find(list.begin(), list.end(), index) == list.end()) list.push_back(index);
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
  std::lock_guard<std::mutex> lock(state_->mutex);
  return static_cast<int64_t>(state_->deferred.size());
}

void GradientBuckets::finish() {
  std::vector<std::pair<const detail::Group*, std::vector<std::size_t>>> rows;
  std::vector<State::Deferred> deferred;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    rows = std::move(state_->waiting);
    deferred = std::move(state_->deferred);
    state_->waiting.clear();
    state_->deferred.clear();
    state_->finished = true;
  }
  for (auto& [group, indices] : rows) {
    std::size_t i = 0;
    while (i < indices.size()) {
      // One bucket: gradients of one dtype up to bucket_bytes (at least one).
      std::vector<at::Tensor*> bucket;
      int64_t bytes = 0;
      const auto dtype = deferred[indices[i]].grad.scalar_type();
      while (i < indices.size()) {
        at::Tensor& g = deferred[indices[i]].grad;
        const int64_t n = g.numel() * static_cast<int64_t>(g.element_size());
        if (g.scalar_type() != dtype || (!bucket.empty() && bytes + n > state_->bucket_bytes)) {
          break;
        }
        bucket.push_back(&g);
        bytes += n;
        ++i;
      }
      std::vector<at::Tensor> flat;
      for (const at::Tensor* g : bucket) flat.push_back(g->reshape({-1}));
      const at::Tensor summed = detail::all_reduce(*group, at::cat(flat), ReduceOp::kSum);
      int64_t offset = 0;
      for (at::Tensor* g : bucket) {
        const int64_t n = g->numel();
        *g = summed.narrow(0, offset, n).view_as(*g);
        offset += n;
      }
    }
  }
  // Whole now: added to what the parameters' .grad() got otherwise.
  for (State::Deferred& d : deferred) {
    at::Tensor& grad = d.param.mutable_grad();
    if (grad.defined()) {
      grad.add_(d.grad);
    } else {
      grad = d.grad.clone();  // its own storage, not a piece of the bucket
    }
  }
  state_->meshes.clear();
}

}  // namespace te
