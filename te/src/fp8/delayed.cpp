// DelayedScaling: scales from an amax history kept in each GEMM's GemmMeta, amaxes reduced over
// the mesh at the end of the autocast region (forward) and of the backward pass (gradients)
// (docs/ARCHITECTURE.md §5).

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>

#include <cmath>
#include <sstream>

#include "recipe_impl.h"
#include "te/error.h"

namespace te::fp8 {

float compute_scale(float amax, float old_scale, float fp8_max, int margin) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return old_scale;
  const float scale = (fp8_max / amax) / std::ldexp(1.0f, margin);
  return std::isfinite(scale) ? scale : old_scale;
}

void update_scales(const at::Tensor& amax_history, const at::Tensor& scale,
                   const at::Tensor& scale_inv, const DelayedScaling& recipe, DType dtype) {
  TE_CHECK(amax_history.dim() == 2 && scale.dim() == 1 && scale_inv.dim() == 1 &&
               amax_history.size(1) == scale.size(0) && scale.size(0) == scale_inv.size(0),
           "update_scales: amax_history ", amax_history.sizes(), ", scale ", scale.sizes(),
           " and scale_inv ", scale_inv.sizes(), " must be [L, n], [n] and [n]");
  TE_CHECK(amax_history.scalar_type() == at::kFloat && scale.scalar_type() == at::kFloat &&
               scale_inv.scalar_type() == at::kFloat,
           "update_scales: the FP8 state must be fp32");
  at::NoGradGuard no_grad;
  const at::Tensor amax = recipe.amax_compute_algo == "most_recent"
                              ? amax_history[0]
                              : std::get<0>(amax_history.max(0));
  // The same fp32 operations as compute_scale, elementwise.
  const at::Tensor quotient =
      at::div(at::full_like(amax, max_finite(dtype)), amax) / std::ldexp(1.0, recipe.margin);
  const at::Tensor keep = (amax > 0) & at::isfinite(amax) & at::isfinite(quotient);
  const at::Tensor next = at::where(keep, quotient, scale);
  scale.copy_(next);
  scale_inv.copy_(at::reciprocal(next));
  amax_history.copy_(at::roll(amax_history, {-1}, {0}));
  amax_history[0].zero_();
}

void add_pending(std::vector<Pending>& list, Pending p) {
  for (const Pending& q : list) {
    if (q.meta == p.meta) return;
  }
  list.push_back(std::move(p));
}

void reduce_and_update(const std::vector<Pending>& items, bool forward) {
  auto history = [forward](const Pending& p) {
    return forward ? p.meta->fwd_amax_history : p.meta->bwd_amax_history;
  };
  at::NoGradGuard no_grad;
  std::vector<AmaxReduction> newest;
  for (const Pending& p : items) {
    std::lock_guard<std::mutex> lock(p.meta->mutex);
    // Only a GEMM on a mesh has anything to reduce (the others keep their row as it is).
    const bool reduced = p.mesh && !p.dims.empty();
    newest.push_back({reduced ? history(p)[0].clone() : at::Tensor(), p.mesh, p.dims});
  }
  reduce_amaxes(newest);
  for (std::size_t i = 0; i < items.size(); ++i) {
    const Pending& p = items[i];
    std::lock_guard<std::mutex> lock(p.meta->mutex);
    if (p.mesh && !p.dims.empty()) history(p)[0].copy_(newest[i].amax);
    const Format format = p.recipe.fp8_format;
    if (forward) {
      update_scales(p.meta->fwd_amax_history, p.meta->fwd_scale, p.meta->fwd_scale_inv, p.recipe,
                    forward_dtype(format));
    } else {
      update_scales(p.meta->bwd_amax_history, p.meta->bwd_scale, p.meta->bwd_scale_inv, p.recipe,
                    backward_dtype(format));
    }
  }
}

void BackwardReduction::add(const std::shared_ptr<BackwardReduction>& self, Pending p) {
  std::lock_guard<std::mutex> lock(self->mu);
  add_pending(self->pending, std::move(p));
  if (self->queued) return;
  self->queued = true;
  self->scopes = ScopeCapture::current();
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    const ScopeLoan loan(self->scopes);
    std::vector<Pending> items;
    {
      std::lock_guard<std::mutex> lock(self->mu);
      items.swap(self->pending);
      self->queued = false;
    }
    reduce_and_update(items, /*forward=*/false);
  });
}

namespace {

// slot = max(slot, amax), NaN winning (at::maximum propagates it), on the device.
void fold_into(const at::Tensor& slot, const at::Tensor& amax) {
  slot.copy_(at::maximum(slot, amax));
}

void ensure_history(GemmMeta& meta, int64_t len) {
  keep_fp32(meta);
  if (meta.fwd_amax_history.size(0) != len) {
    meta.fwd_amax_history.set_data(at::zeros({len, 2}, meta.fwd_amax_history.options()));
  }
  if (meta.bwd_amax_history.size(0) != len) {
    meta.bwd_amax_history.set_data(at::zeros({len, 1}, meta.bwd_amax_history.options()));
  }
}

class Delayed final : public RecipeImpl {
 public:
  explicit Delayed(DelayedScaling r) : r_(std::move(r)) {}

  std::string name() const override { return "delayed"; }
  Format format() const override { return r_.fp8_format; }
  std::string to_string() const override {
    std::ostringstream os;
    os << "DelayedScaling(margin=" << r_.margin << ", format=" << format_name(r_.fp8_format)
       << ", amax_history_len=" << r_.amax_history_len
       << ", amax_compute_algo=" << r_.amax_compute_algo << ")";
    return os.str();
  }

  ForwardCasts cast_forward(const at::Tensor& x, const at::Tensor& w,
                            GemmCall& call) const override {
    const DType dtype = forward_dtype(r_.fp8_format);
    GemmMeta& meta = *call.meta;
    const auto xq = cast_x(x, call);
    std::lock_guard<std::mutex> lock(meta.mutex);
    const at::Tensor newest = meta.fwd_amax_history[0];
    // The kernel's codes are reused while the kernel and its scale are unchanged: the scale is
    // known unchanged while its buffer is not written (its version), so no value is read back
    // from the device. (A scale update rewrites it, and the kernel is cast again.)
    auto& c = meta.kernel_cache;
    const auto scale_version = static_cast<int64_t>(meta.fwd_scale._version());
    const void* scale_data = meta.fwd_scale.data_ptr();
    const std::vector<int64_t> strides(w.strides().begin(), w.strides().end());
    if (c.storage.unsafeGetStorageImpl() == w.storage().unsafeGetStorageImpl() &&
        c.data == w.data_ptr() && c.version == static_cast<int64_t>(w._version()) &&
        c.scale_data == scale_data && c.scale_version == scale_version && c.dtype == dtype &&
        c.codes.data.sizes() == w.sizes() && c.strides == strides) {
      ++meta.kernel_cache_hits;
    } else {
      c.amax = at::zeros({1}, newest.options());
      auto fresh = cast_transpose(w, meta.fwd_scale.narrow(0, 1, 1), dtype, c.amax);
      c.codes = fresh.first;
      c.storage = w.storage();
      c.data = w.data_ptr();
      c.strides = strides;
      c.version = static_cast<int64_t>(w._version());
      c.scale_data = scale_data;
      c.scale_version = scale_version;
      c.dtype = dtype;
      c.transposed = fresh.second;
    }
    if (call.record) {
      fold_into(newest.narrow(0, 1, 1), c.amax);
      if (call.region != nullptr) add_pending(call.region->forward, pending(call));
    }
    return {xq.first, c.transposed, xq.second, c.codes};
  }

  // A held kernel: x alone, its amax recorded (the kernel's history slot stays unused).
  ForwardCasts cast_input(const at::Tensor& x, GemmCall& call) const override {
    auto xq = cast_x(x, call);
    if (call.record && call.region != nullptr) {
      std::lock_guard<std::mutex> lock(call.meta->mutex);
      add_pending(call.region->forward, pending(call));
    }
    return {xq.first, {}, xq.second, {}};
  }

  // TE casts a master weight with its quantizer's delayed scale
  // (_cast_master_weights_to_fp8_delayed_scaling, pytorch/tensor/utils.py, d0067d0da); te-cpp
  // casts it with the scale the recipe's rule gives its current amax, (fp8_max / amax) /
  // 2^margin (2^-margin for an amax of 0 or not finite), as freeze_kernel casts a weight with
  // its own amax (without the margin there): no history slot to keep in step with a weight cast
  // once per optimizer step.
  at::Tensor weight_scale(const at::Tensor& amax) const override {
    return scales_from_amax(amax, max_finite(forward_dtype(r_.fp8_format)), false, 0.0f) /
           std::ldexp(1.0, r_.margin);
  }

  GradCasts cast_grad(const at::Tensor& g, GemmCall& call) const override {
    const DType dtype = backward_dtype(r_.fp8_format);
    GemmMeta& meta = *call.meta;
    at::Tensor g_scale;
    {
      std::lock_guard<std::mutex> lock(meta.mutex);
      g_scale = meta.bwd_scale.narrow(0, 0, 1).clone();
    }
    const at::Tensor g_amax = call.record ? at::zeros({1}, g_scale.options()) : at::Tensor();
    auto gq = cast_transpose(g, g_scale, dtype, g_amax);
    if (call.record) {
      {
        std::lock_guard<std::mutex> lock(meta.mutex);
        fold_into(meta.bwd_amax_history[0].narrow(0, 0, 1), g_amax);
      }
      BackwardReduction::add(call.backward, pending(call));
    }
    return {gq.first, gq.second};
  }

  void calibrate(const at::Tensor& x, const at::Tensor& w, GemmCall& call) const override {
    at::NoGradGuard no_grad;
    const at::Tensor x_amax = fp8::amax(x.detach()), w_amax = fp8::amax(w.detach());
    GemmMeta& meta = *call.meta;
    std::lock_guard<std::mutex> lock(meta.mutex);
    ensure_history(meta, r_.amax_history_len);
    const at::Tensor newest = meta.fwd_amax_history[0];
    fold_into(newest.narrow(0, 0, 1), x_amax);
    fold_into(newest.narrow(0, 1, 1), w_amax);
    if (call.region != nullptr) add_pending(call.region->forward, pending(call));
  }

 private:
  Pending pending(const GemmCall& call) const { return {call.meta, r_, call.mesh, call.dims}; }

  // x cast with the stored input scale, its amax folded into the newest history row when
  // recording.
  std::pair<Fp8Tensor, Fp8Tensor> cast_x(const at::Tensor& x, GemmCall& call) const {
    GemmMeta& meta = *call.meta;
    at::Tensor x_scale;
    {
      std::lock_guard<std::mutex> lock(meta.mutex);
      // Outside training the history keeps its length: nothing is recorded into it.
      if (call.record)
        ensure_history(meta, r_.amax_history_len);
      else
        keep_fp32(meta);
      x_scale = meta.fwd_scale.narrow(0, 0, 1).clone();
    }
    const at::Tensor x_amax = call.record ? at::zeros({1}, x_scale.options()) : at::Tensor();
    auto xq = cast_transpose(x, x_scale, forward_dtype(r_.fp8_format), x_amax);
    if (call.record) {
      std::lock_guard<std::mutex> lock(meta.mutex);
      fold_into(meta.fwd_amax_history[0].narrow(0, 0, 1), x_amax);
    }
    return xq;
  }

  DelayedScaling r_;
};

}  // namespace

std::shared_ptr<const RecipeImpl> implement(const DelayedScaling& r) {
  TE_CHECK(r.amax_history_len >= 1, "DelayedScaling: amax_history_len is ", r.amax_history_len,
           "; it needs at least 1 (TE's default is 1024)");
  TE_CHECK(r.margin >= 0, "DelayedScaling: margin is ", r.margin,
           "; it is a non-negative power-of-two backoff (0 by default)");
  TE_CHECK(r.amax_compute_algo == "max" || r.amax_compute_algo == "most_recent",
           "DelayedScaling: amax_compute_algo '", r.amax_compute_algo,
           "' is not 'max' or 'most_recent'");
  return std::make_shared<Delayed>(r);
}

}  // namespace te::fp8
