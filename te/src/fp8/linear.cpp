// The FP8 linear op (docs/ARCHITECTURE.md §5): y = x w through the recipe's casts, an autograd
// Function whose backward runs the dgrad and wgrad GEMMs on the saved codes; and the frozen form
// (weights held as codes, inference only).

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "recipe_impl.h"
#include "te/distributed/mesh.h"
#include "te/distributed/scopes.h"
#include "te/error.h"
#include "te/fp8.h"

namespace te::fp8 {

namespace {

// Everything one FP8 GEMM's backward needs.
struct LinearState : torch::CustomClassHolder {
  Recipe recipe;
  GemmCall call;
  Fp8Tensor x_t;  // x^T codes [K, M] (wgrad's a)
  Fp8Tensor w;    // w codes [K, N] (dgrad's b_t)
  int64_t n = 0;  // w's N (NVFP4's codes pack two a byte, so not w.data's)
  std::vector<int64_t> x_shape;
  at::ScalarType x_dtype = at::kFloat, w_dtype = at::kFloat;
  ScopeCapture scopes;  // of the thread that ran forward, lent to the one running backward
  // A held kernel (hold_kernel): this rank's piece of its codes, how they reach the GEMM's layout
  // and how the gradient returns; w above stays empty where they are gathered (again in
  // backward, as FSDP's reshard-after-forward does).
  Fp8Tensor held;
  KernelMoves moves;
  std::vector<int64_t> master_shape, used_shape;  // the piece's; the gathered kernel's

  // The held codes as the GEMM multiplies them, [K, N].
  Fp8Tensor held_for_gemm() {
    const at::Tensor codes = moves.gather ? moves.gather(held.data) : held.data;
    used_shape = codes.sizes().vec();
    return {codes.reshape({codes.size(0), -1}), held.scale_inv, held.dtype};
  }
};

// The recipe casts the operands; the GEMMs are the same for every recipe (gemm_nt dispatches on
// the operands' scaling mode).
class Fp8Linear : public torch::autograd::Function<Fp8Linear> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w, c10::intrusive_ptr<LinearState> s) {
    const at::Tensor x2 = x.reshape({-1, x.size(-1)});
    const RecipeImpl& recipe = s->recipe.impl();
    // The region is lent for this call only (the state outlives it, into backward).
    struct Lend {
      GemmCall& call;
      ~Lend() { call.region = nullptr; }
    } lend{s->call};
    s->call.region = current_region().get();
    ForwardCasts q;
    if (s->held.data.defined()) {
      q = recipe.cast_input(x2, s->call);
      const Fp8Tensor w_codes = s->held_for_gemm();
      TE_CHECK(w_codes.data.size(0) == x2.size(1), "FP8 GEMM '", s->call.meta->prefix,
               "kernel': input ", x.sizes(), " and held kernel ", s->used_shape,
               " do not contract");
      q.w_t = {w_codes.data.t().contiguous(), w_codes.scale_inv, w_codes.dtype};
      s->n = w_codes.data.size(1);
      if (!s->moves.gather) q.w = w_codes;
      s->master_shape = w.sizes().vec();
    } else {
      q = recipe.cast_forward(x2, w, s->call);
      s->n = w.size(1);
    }
    s->x_t = std::move(q.x_t);
    s->w = std::move(q.w);
    s->x_shape = {x.sizes().begin(), x.sizes().end()};
    s->x_dtype = x.scalar_type();
    s->w_dtype = w.scalar_type();
    s->scopes = ScopeCapture::current();
    ctx->saved_data["state"] = c10::IValue::make_capsule(s);
    std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end() - 1);
    if (s->held.data.defined()) {
      out_shape.insert(out_shape.end(), s->used_shape.begin() + 1, s->used_shape.end());
    } else {
      out_shape.push_back(s->n);
    }
    // The GEMM writes the output's dtype itself (on CUDA: no fp32 pass over the output).
    return gemm_nt(q.x, q.w_t, recipe.fast_forward_accumulation(), x.scalar_type())
        .reshape(out_shape);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto s = c10::static_intrusive_pointer_cast<LinearState>(ctx->saved_data["state"].toCapsule());
    const ScopeLoan loan(s->scopes);
    const at::Tensor g2 = grads[0].reshape({-1, s->n});
    const GradCasts gq = s->recipe.impl().cast_grad(g2, s->call);
    // dgrad = g w^T and wgrad = x^T g, each with the transposed codes it takes at hand.
    const Fp8Tensor w = s->w.data.defined() ? s->w : s->held_for_gemm();
    const at::Tensor grad_x = gemm_nt(gq.g, w, false, s->x_dtype).reshape(s->x_shape);
    at::Tensor grad_w = gemm_nt(s->x_t, gq.g_t, false, s->w_dtype);
    if (s->held.data.defined()) {
      // Back to the master piece: in the gathered kernel's shape, then moved.
      grad_w = grad_w.reshape(s->used_shape);
      if (s->moves.route_grad) grad_w = s->moves.route_grad(grad_w);
      grad_w = grad_w.reshape(s->master_shape);
    }
    return {grad_x, grad_w, at::Tensor()};
  }
};

}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const std::shared_ptr<GemmMeta>& meta,
                  const DeviceMesh* mesh, const KernelMoves* moves,
                  const std::vector<int64_t>* amax_dims) {
  const auto region = current_region();
  TE_CHECK(region && (region->enabled || region->calibrating),
           "fp8::linear runs inside an enabled te::Fp8Autocast (or a calibrating one); open one "
           "(or call the fp32 path)");
  TE_CHECK(meta != nullptr, "fp8::linear: no FP8 state given for this GEMM");
  auto s = c10::make_intrusive<LinearState>();
  std::unique_lock<std::mutex> held_lock(meta->mutex);
  const bool held = region->enabled && meta->holds_kernel();
  TE_CHECK(held || moves == nullptr || !region->enabled, "fp8::linear: the GEMM '", meta->prefix,
           "kernel' was given the moves of held FP8 weights but holds none (released meanwhile?)");
  if (held) {
    TE_CHECK(meta->held_recipe->to_string() == region->recipe.to_string(),
             "FP8 weights: the GEMM '", meta->prefix, "kernel' holds codes cast under ",
             meta->held_recipe->to_string(), " but the autocast runs ", region->recipe.to_string(),
             "; autocast with the recipe the weights were held with, or call "
             "te::nn::release_fp8_weights(model) to cast the kernels under this one");
    const GemmMeta::MasterStamp& stamp = meta->held_from;
    TE_CHECK(stamp.storage.unsafeGetStorageImpl() == w.storage().unsafeGetStorageImpl() &&
                 stamp.data == w.data_ptr() && stamp.version == static_cast<int64_t>(w._version()),
             "FP8 weights: the kernel '", meta->prefix,
             "kernel' changed since its FP8 codes were cast (an optimizer step, a load); call "
             "te::nn::requantize_fp8_weights(model) after each optimizer.step()");
    s->held = meta->held_kernel;
    if (moves != nullptr) s->moves = *moves;
    held_lock.unlock();
  } else {
    held_lock.unlock();
    TE_CHECK(w.dim() == 2 && x.dim() >= 1 && x.size(-1) == w.size(0), "fp8::linear: input ",
             x.sizes(), " and kernel ", w.sizes(),
             " do not contract (the input's last dim must equal the kernel's first)");
  }
  s->recipe = region->recipe;
  GemmCall& call = s->call;
  call.meta = meta;
  call.backward = region->backward;
  call.record = records(*meta);
  if (mesh == nullptr) mesh = current_mesh();
  if (mesh != nullptr && amax_dims != nullptr) {
    for (const int64_t d : *amax_dims) {
      TE_CHECK(d >= 0 && d < mesh->ndim(), "fp8::linear: amax dim ", d, " is not a dim of ",
               mesh->to_string());
      if (mesh->size(d) > 1) call.dims.push_back(d);
    }
    call.mesh = *mesh;
  } else if (mesh != nullptr) {
    // Every mesh axis but the pipeline's: stages hold different layers.
    const auto resource = current_mesh_resource();
    const std::optional<std::string> pp = resource ? resource->pp : std::nullopt;
    for (int64_t d = 0; d < mesh->ndim(); ++d) {
      if (mesh->size(d) > 1 && (!pp || mesh->axis_names()[d] != *pp)) call.dims.push_back(d);
    }
    call.mesh = *mesh;
  }
  if (!region->enabled) {
    // Calibrating in high precision: the recipe records what it keeps (DelayedScaling: the
    // amaxes; the others keep no scales to calibrate).
    call.region = region.get();
    s->recipe.impl().calibrate(x, w, call);
    // LibTorch 1.13 has no CPU fp16 GEMM: widen (exact), multiply in fp32, round once.
    if (x.scalar_type() == at::kHalf && x.device().is_cpu()) {
      return at::matmul(x.to(at::kFloat), w.to(at::kFloat)).to(at::kHalf);
    }
    return at::matmul(x, w);
  }
  return Fp8Linear::apply(x, w, s);
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
    meta.frozen_kernel = q.data;
    meta.frozen_kernel_scale_inv = q.scale_inv;
  }
  meta.kernel_cache = GemmMeta::KernelCache{};
}

void prepare_frozen_kernel(GemmMeta& meta, const std::vector<int64_t>& shape) {
  std::lock_guard<std::mutex> lock(meta.mutex);
  if (meta.frozen()) return;
  meta.frozen_kernel = at::zeros(shape, at::kByte);
  meta.frozen_kernel_scale_inv = at::ones({1});
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
