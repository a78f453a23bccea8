// Fp8Autocast, the FP8 state of a GEMM, the FP8 linear op and the amax reduction
// (docs/ARCHITECTURE.md §5).

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <exception>
#include <mutex>

#include "te/distributed/mesh.h"
#include "te/distributed/scopes.h"
#include "te/error.h"
#include "te/fp8.h"

namespace te::fp8 {

namespace {

// A GEMM whose amaxes wait to be reduced (MAX over `dims` of `mesh`) and turned into scales.
struct Pending {
  std::shared_ptr<GemmMeta> meta;
  DelayedScaling recipe;
  std::optional<DeviceMesh> mesh;  // none: one process
  std::vector<int64_t> dims;
};

void add_pending(std::vector<Pending>& list, Pending p) {
  for (const Pending& q : list) {
    if (q.meta == p.meta) return;
  }
  list.push_back(std::move(p));
}

// One fused all-reduce (MAX) per (mesh, dims) over every pending GEMM's newest amax row, then
// each GEMM's DelayedScaling update.
void reduce_and_update(const std::vector<Pending>& items, bool forward) {
  std::vector<bool> done(items.size(), false);
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (done[i]) continue;
    std::vector<const Pending*> batch;
    for (std::size_t j = i; j < items.size(); ++j) {
      if (!done[j] && items[j].mesh == items[i].mesh && items[j].dims == items[i].dims) {
        batch.push_back(&items[j]);
        done[j] = true;
      }
    }
    auto history = [forward](const Pending* p) {
      return forward ? p->meta->fwd_amax_history : p->meta->bwd_amax_history;
    };
    at::NoGradGuard no_grad;
    if (items[i].mesh && !items[i].dims.empty()) {
      std::vector<at::Tensor> rows;
      for (const Pending* p : batch) {
        std::lock_guard<std::mutex> lock(p->meta->mutex);
        rows.push_back(history(p)[0].clone());
      }
      const at::Tensor reduced =
          items[i].mesh->all_reduce(at::cat(rows), ReduceOp::kMax, items[i].dims);
      int64_t offset = 0;
      for (const Pending* p : batch) {
        std::lock_guard<std::mutex> lock(p->meta->mutex);
        at::Tensor row = history(p)[0];
        row.copy_(reduced.narrow(0, offset, row.numel()));
        offset += row.numel();
      }
    }
    for (const Pending* p : batch) {
      std::lock_guard<std::mutex> lock(p->meta->mutex);
      const Format format = p->recipe.fp8_format;
      if (forward) {
        update_scales(p->meta->fwd_amax_history, p->meta->fwd_scale, p->meta->fwd_scale_inv,
                      p->recipe, forward_dtype(format));
      } else {
        update_scales(p->meta->bwd_amax_history, p->meta->bwd_scale, p->meta->bwd_scale_inv,
                      p->recipe, backward_dtype(format));
      }
    }
  }
}

// Backward amaxes of the GEMMs of one (outermost) autocast region: reduced and applied by a
// callback the autograd engine runs when the backward pass ends.
struct BackwardReduction {
  std::mutex mu;
  std::vector<Pending> pending;
  bool queued = false;
  ScopeCapture scopes;  // of the backward that queued the callback (its trace sees the reduce)

  static void add(const std::shared_ptr<BackwardReduction>& self, Pending p) {
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
};

}  // namespace

// One Fp8Autocast region: its switches, the region it nests in, the forward GEMMs whose amaxes
// its end reduces, and the backward reduction its GEMMs share.
struct Region {
  bool enabled = false;
  bool calibrating = false;
  Recipe recipe;
  std::shared_ptr<Region> parent;
  std::vector<Pending> forward;
  std::shared_ptr<BackwardReduction> backward;
};

namespace {

std::shared_ptr<Region>& current_region() {
  thread_local std::shared_ptr<Region> region;
  return region;
}

// Everything one FP8 GEMM's backward needs.
struct LinearState : torch::CustomClassHolder {
  std::shared_ptr<GemmMeta> meta;
  Recipe recipe;
  std::optional<DeviceMesh> mesh;
  std::vector<int64_t> dims;
  std::shared_ptr<BackwardReduction> backward;
  bool record = true;  // records(meta) when the GEMM ran
  Fp8Tensor x_t;       // x^T codes [K, M]
  Fp8Tensor w;         // w codes [K, N] (dgrad's b_t)
  std::vector<int64_t> x_shape;
  at::ScalarType x_dtype = at::kFloat, w_dtype = at::kFloat;
  ScopeCapture scopes;  // of the thread that ran forward, lent to the one running backward
};

// CurrentScaling: the whole tensor's amax (MAX over the mesh dims), then its scale: on the
// tensor's device, compute_scale's fp32 operations elementwise (no host round trip).
at::Tensor current_scale(const at::Tensor& x, const LinearState& s, DType dtype) {
  at::Tensor a = fp8::amax(x);
  if (s.mesh && !s.dims.empty()) {
    a = s.mesh->all_reduce(a, ReduceOp::kMax, s.dims);
  }
  const at::Tensor quotient = at::div(at::full_like(a, max_finite(dtype)), a);
  return at::where((a > 0) & at::isfinite(a) & at::isfinite(quotient), quotient, at::ones_like(a));
}

// slot = max(slot, amax), NaN winning (at::maximum propagates it), on the device.
void fold_amax(const at::Tensor& slot, const at::Tensor& amax) {
  slot.copy_(at::maximum(slot, amax));
}

// The FP8 state stays fp32 whatever the module's dtype: module->to(at::kBFloat16) converts every
// floating buffer, these included, and scales or amaxes rounded to 8 mantissa bits would change
// the casts. Converted back here on first use (values that went through bf16 keep that rounding).
void keep_fp32(GemmMeta& meta) {
  for (at::Tensor* t : {&meta.fwd_scale, &meta.fwd_scale_inv, &meta.fwd_amax_history,
                        &meta.bwd_scale, &meta.bwd_scale_inv, &meta.bwd_amax_history}) {
    if (t->scalar_type() != at::kFloat) t->set_data(t->to(at::kFloat));
  }
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

class Fp8Linear : public torch::autograd::Function<Fp8Linear> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, c10::intrusive_ptr<LinearState> s) {
    const int64_t k = w.size(0);
    const at::Tensor x2 = x.reshape({-1, k});
    const DType dtype = forward_dtype(format_of(s->recipe));
    GemmMeta& meta = *s->meta;
    std::pair<Fp8Tensor, Fp8Tensor> xq, wq;
    if (const auto* d = std::get_if<DelayedScaling>(&s->recipe)) {
      at::Tensor x_scale;
      {
        std::lock_guard<std::mutex> lock(meta.mutex);
        // Outside training the history keeps its length: nothing is recorded into it.
        if (s->record)
          ensure_history(meta, d->amax_history_len);
        else
          keep_fp32(meta);
        x_scale = meta.fwd_scale.narrow(0, 0, 1).clone();
      }
      const at::Tensor x_amax = s->record ? at::zeros({1}, x_scale.options()) : at::Tensor();
      xq = cast_transpose(x2, x_scale, dtype, x_amax);
      std::lock_guard<std::mutex> lock(meta.mutex);
      const at::Tensor newest = meta.fwd_amax_history[0];
      if (s->record) fold_amax(newest.narrow(0, 0, 1), x_amax);
      // The kernel's codes are reused while the kernel and its scale are unchanged: the scale
      // is known unchanged while its buffer is not written (its version), so no value is read
      // back from the device. (A scale update rewrites it, and the kernel is cast again.)
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
      wq = {c.codes, c.transposed};
      if (s->record) {
        fold_amax(newest.narrow(0, 1, 1), c.amax);
        Region* region = current_region().get();
        if (region != nullptr) add_pending(region->forward, {s->meta, *d, s->mesh, s->dims});
      }
    } else {
      xq = cast_transpose(x2, current_scale(x2, *s, dtype), dtype);
      wq = cast_transpose(w, current_scale(w, *s, dtype), dtype);
    }
    s->x_t = xq.second;
    s->w = wq.first;
    s->x_shape = {x.sizes().begin(), x.sizes().end()};
    s->x_dtype = x.scalar_type();
    s->w_dtype = w.scalar_type();
    s->scopes = ScopeCapture::current();
    ctx->saved_data["state"] = c10::IValue::make_capsule(s);
    std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end() - 1);
    out_shape.push_back(w.size(1));
    return gemm_nt(xq.first, wq.second, /*fast_accumulation=*/true)
        .reshape(out_shape)
        .to(x.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto s = c10::static_intrusive_pointer_cast<LinearState>(ctx->saved_data["state"].toCapsule());
    const ScopeLoan loan(s->scopes);
    const int64_t n = s->w.data.size(1);
    const at::Tensor g2 = grads[0].reshape({-1, n});
    const DType dtype = backward_dtype(format_of(s->recipe));
    std::pair<Fp8Tensor, Fp8Tensor> gq;  // g [M, N] and g^T [N, M]
    if (const auto* d = std::get_if<DelayedScaling>(&s->recipe)) {
      GemmMeta& meta = *s->meta;
      at::Tensor g_scale;
      {
        std::lock_guard<std::mutex> lock(meta.mutex);
        g_scale = meta.bwd_scale.narrow(0, 0, 1).clone();
      }
      const at::Tensor g_amax = s->record ? at::zeros({1}, g_scale.options()) : at::Tensor();
      gq = cast_transpose(g2, g_scale, dtype, g_amax);
      if (s->record) {
        {
          std::lock_guard<std::mutex> lock(meta.mutex);
          fold_amax(meta.bwd_amax_history[0].narrow(0, 0, 1), g_amax);
        }
        BackwardReduction::add(s->backward, {s->meta, *d, s->mesh, s->dims});
      }
    } else {
      gq = cast_transpose(g2, current_scale(g2, *s, dtype), dtype);
    }
    // dgrad = g w^T and wgrad = x^T g, each with the transposed codes it takes at hand.
    const at::Tensor grad_x = gemm_nt(gq.first, s->w).reshape(s->x_shape).to(s->x_dtype);
    const at::Tensor grad_w = gemm_nt(s->x_t, gq.second).to(s->w_dtype);
    return {grad_x, grad_w, at::Tensor()};
  }
};

}  // namespace

std::shared_ptr<GemmMeta> GemmMeta::registered(torch::nn::Module& module, const std::string& prefix,
                                               int64_t history_len) {
  TE_CHECK(history_len >= 1, "GemmMeta: history_len is ", history_len, "; it needs at least 1");
  auto m = std::make_shared<GemmMeta>();
  m->owner = &module;
  m->prefix = prefix;
  m->fwd_scale = module.register_buffer(prefix + "fp8_fwd_scale", at::ones({2}));
  m->fwd_scale_inv = module.register_buffer(prefix + "fp8_fwd_scale_inv", at::ones({2}));
  m->fwd_amax_history =
      module.register_buffer(prefix + "fp8_fwd_amax_history", at::zeros({history_len, 2}));
  m->bwd_scale = module.register_buffer(prefix + "fp8_bwd_scale", at::ones({1}));
  m->bwd_scale_inv = module.register_buffer(prefix + "fp8_bwd_scale_inv", at::ones({1}));
  m->bwd_amax_history =
      module.register_buffer(prefix + "fp8_bwd_amax_history", at::zeros({history_len, 1}));
  return m;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::shared_ptr<GemmMeta>& meta,
                  const DeviceMesh* mesh) {
  const auto region = current_region();
  TE_CHECK(region && (region->enabled || region->calibrating),
           "fp8::linear runs inside an enabled te::Fp8Autocast (or a calibrating one); open one "
           "(or call the fp32 path)");
  TE_CHECK(meta != nullptr, "fp8::linear: no FP8 state given for this GEMM");
  TE_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(0), "fp8::linear: input ",
           x.sizes(), " and kernel ", w.sizes(),
           " do not contract (the input's last dim must equal the kernel's first)");
  auto s = c10::make_intrusive<LinearState>();
  s->meta = meta;
  s->recipe = region->recipe;
  s->backward = region->backward;
  s->record = records(*meta);
  if (mesh == nullptr) mesh = current_mesh();
  if (mesh != nullptr) {
    // Every mesh axis but the pipeline's: stages hold different layers.
    const auto resource = current_mesh_resource();
    const std::optional<std::string> pp = resource ? resource->pp : std::nullopt;
    for (int64_t d = 0; d < mesh->ndim(); ++d) {
      if (mesh->size(d) > 1 && (!pp || mesh->axis_names()[d] != *pp)) s->dims.push_back(d);
    }
    s->mesh = *mesh;
  }
  if (!region->enabled) {
    // Calibrating in high precision: only the amaxes are recorded (DelayedScaling; a
    // CurrentScaling recipe keeps no scales to calibrate).
    if (const auto* d = std::get_if<DelayedScaling>(&s->recipe)) {
      at::NoGradGuard no_grad;
      const at::Tensor x_amax = fp8::amax(x.detach()), w_amax = fp8::amax(w.detach());
      std::lock_guard<std::mutex> lock(meta->mutex);
      ensure_history(*meta, d->amax_history_len);
      const at::Tensor newest = meta->fwd_amax_history[0];
      fold_amax(newest.narrow(0, 0, 1), x_amax);
      fold_amax(newest.narrow(0, 1, 1), w_amax);
      add_pending(region->forward, {s->meta, *d, s->mesh, s->dims});
    }
    // LibTorch 1.13 has no CPU fp16 GEMM: widen (exact), multiply in fp32, round once.
    if (x.scalar_type() == at::kHalf && x.device().is_cpu()) {
      return at::matmul(x.to(at::kFloat), w.to(at::kFloat)).to(at::kHalf);
    }
    return at::matmul(x, w);
  }
  return Fp8Linear::apply(x, w, s);
}

bool records(const GemmMeta& meta) {
  const auto& region = current_region();
  if (region && region->calibrating) return true;
  if (c10::InferenceMode::is_enabled()) return false;
  return meta.owner == nullptr || meta.owner->is_training();
}

void check_freezable(const GemmMeta& meta) {
  std::lock_guard<std::mutex> lock(const_cast<GemmMeta&>(meta).mutex);
  TE_CHECK(
      meta.fwd_amax_history.defined() && meta.fwd_amax_history.select(1, 0).max().item<float>() > 0,
      "FP8 weights: the GEMM '", meta.prefix, "kernel' has no input scale (buffer '", meta.prefix,
      "fp8_fwd_amax_history' holds no amax); train with FP8 (DelayedScaling) "
      "or calibrate (te::Fp8Autocast with calibrating = true) before freezing");
}

void freeze_kernel(GemmMeta& meta, const at::Tensor& w) {
  TE_CHECK(meta.owner != nullptr, "fp8::freeze_kernel: this FP8 state belongs to no module");
  TE_CHECK(w.dim() >= 2, "fp8::freeze_kernel: the kernel '", meta.prefix, "kernel' is ", w.sizes(),
           "; FP8 weights need a kernel of 2 or more dims");
  at::NoGradGuard no_grad;
  check_freezable(meta);
  std::lock_guard<std::mutex> lock(meta.mutex);
  keep_fp32(meta);
  const Fp8Tensor q = quantize_to_own_scale(w, DType::kE4M3);
  if (meta.frozen()) {
    meta.frozen_kernel.set_data(q.data);
    meta.frozen_kernel_scale_inv.set_data(q.scale_inv);
  } else {
    meta.frozen_kernel = meta.owner->register_buffer(meta.prefix + "fp8_kernel", q.data);
    meta.frozen_kernel_scale_inv =
        meta.owner->register_buffer(meta.prefix + "fp8_kernel_scale_inv", q.scale_inv);
  }
  meta.kernel_cache = GemmMeta::KernelCache{};
}

void prepare_frozen_kernel(GemmMeta& meta, const std::vector<int64_t>& shape) {
  TE_CHECK(meta.owner != nullptr,
           "fp8::prepare_frozen_kernel: this FP8 state belongs to no module");
  std::lock_guard<std::mutex> lock(meta.mutex);
  if (meta.frozen()) return;
  meta.frozen_kernel =
      meta.owner->register_buffer(meta.prefix + "fp8_kernel", at::zeros(shape, at::kByte));
  meta.frozen_kernel_scale_inv =
      meta.owner->register_buffer(meta.prefix + "fp8_kernel_scale_inv", at::ones({1}));
  meta.kernel_cache = GemmMeta::KernelCache{};
}

at::Tensor frozen_linear(const at::Tensor& x, const GemmMeta& meta) {
  TE_CHECK(meta.frozen(), "fp8::frozen_linear: the GEMM '", meta.prefix,
           "kernel' holds no FP8 weights (see freeze_kernel)");
  TE_CHECK(!(at::GradMode::is_enabled() && x.requires_grad()), "the GEMM '", meta.prefix,
           "kernel' holds FP8 weights (inference only) but its input requires grad; run under "
           "c10::InferenceMode or torch::NoGradGuard, or load the fp32 weights to train");
  const at::Tensor& codes = meta.frozen_kernel;
  TE_CHECK(x.dim() >= 1 && x.size(-1) == codes.size(0), "FP8 GEMM '", meta.prefix,
           "kernel': input ", x.sizes(), " and kernel ", codes.sizes(), " do not contract");
  const at::Tensor x2 = x.reshape({-1, codes.size(0)});
  at::Tensor x_scale;
  {
    std::lock_guard<std::mutex> lock(const_cast<GemmMeta&>(meta).mutex);
    x_scale = meta.fwd_scale.narrow(0, 0, 1).to(at::kFloat).clone();
  }
  const Fp8Tensor xq = quantize(x2.to(at::kFloat), x_scale, DType::kE4M3);
  // module->to(dtype) converts floating buffers; the scale stays fp32 here.
  const Fp8Tensor wq{codes.reshape({codes.size(0), -1}),
                     meta.frozen_kernel_scale_inv.to(at::kFloat), DType::kE4M3};
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end() - 1);
  out_shape.insert(out_shape.end(), codes.sizes().begin() + 1, codes.sizes().end());
  return gemm(xq, wq, /*fast_accumulation=*/true).reshape(out_shape).to(x.scalar_type());
}

}  // namespace te::fp8

namespace te {

Fp8Autocast::Fp8Autocast(bool enabled, fp8::Recipe recipe,
                         std::optional<MeshResource> mesh_resource, bool calibrating) {
  fp8::validate_recipe(recipe);
  if (mesh_resource) resource_scope_.emplace(*mesh_resource);
  auto region = std::make_shared<fp8::Region>();
  region->enabled = enabled;
  region->calibrating = calibrating;
  region->recipe = std::move(recipe);
  region->parent = fp8::current_region();
  region->backward =
      region->parent ? region->parent->backward : std::make_shared<fp8::BackwardReduction>();
  fp8::current_region() = region;
  region_ = region;
  uncaught_ = std::uncaught_exceptions();
}

Fp8Autocast::~Fp8Autocast() noexcept(false) {
  const std::shared_ptr<fp8::Region>& region = region_;
  fp8::current_region() = region->parent;
  if (region->forward.empty()) return;
  // Unwinding: the other ranks may not reach their reduction; drop this step's amaxes.
  if (std::uncaught_exceptions() > uncaught_) return;
  for (fp8::Region* r = region->parent.get(); r != nullptr; r = r->parent.get()) {
    if (r->enabled || r->calibrating) {
      for (auto& p : region->forward) fp8::add_pending(r->forward, std::move(p));
      return;
    }
  }
  fp8::reduce_and_update(region->forward, /*forward=*/true);
}

bool fp8_enabled() {
  const auto& region = fp8::current_region();
  return region && region->enabled;
}

bool fp8_calibrating() {
  const auto& region = fp8::current_region();
  return region && region->calibrating;
}

std::optional<fp8::Recipe> fp8_recipe() {
  const auto& region = fp8::current_region();
  if (!region) return std::nullopt;
  return region->recipe;
}

}  // namespace te
