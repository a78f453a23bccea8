#include "te/nn/functional.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>

#include "activation_cpu.h"
#include "cpu_gemm.h"
#include "matmul.h"
#include "rms_norm_cpu.h"
#include "te/compat.h"
#include "te/distributed/scopes.h"
#include "te/fp8.h"

#include "te/error.h"
#include "te/nn/random.h"

namespace te::nn::functional {

namespace {

using Placements = std::vector<Placement>;

std::vector<int64_t> shape_of(const at::Tensor& t) { return {t.sizes().begin(), t.sizes().end()}; }

using detail::mm_any;
using detail::slow_cpu_gemm_dtype;

void check_same_mesh(const DTensor& a, const DTensor& b, const char* what) {
  TE_CHECK(a.mesh() == b.mesh(), what, ": operands live on different meshes (",
           a.mesh().to_string(), " and ", b.mesh().to_string(), ")");
}

// Aligns a parameter whose dims are `y`'s last p.dim() dims to y's layout: sharded where y is
// sharded on one of those dims, replicated elsewhere; where y is sharded on a leading (batch)
// dim, every rank's gradient of the replicated parameter is a partial sum.
at::Tensor aligned_param(const DTensor& p, const Placements& y, int64_t y_dim, const char* what) {
  const int64_t offset = y_dim - p.dim();
  Placements use(y.size()), grads(y.size());
  for (std::size_t m = 0; m < y.size(); ++m) {
    TE_CHECK(!is_partial(y[m]), "internal: ", what, " on a Partial tensor");
    if (const auto* s = std::get_if<Shard>(&y[m])) {
      if (s->dim >= offset) {
        use[m] = Shard{s->dim - offset};
        grads[m] = use[m];
      } else {
        use[m] = Replicate{};
        grads[m] = Partial{};
      }
    } else {
      use[m] = Replicate{};
      grads[m] = Replicate{};
    }
  }
  return p.redistribute(use, grads).to_local();
}

// A kernel sharded on the mesh and gathered for one matmul.
struct GatheredKernel : torch::CustomClassHolder {
  std::optional<DeviceMesh> mesh;
  Placements placements;  // the kernel's own layout
  std::vector<int64_t> global_shape;
  Placements use;    // the layout the matmul uses (gathered where FSDP)
  Placements grads;  // how each rank's kernel gradient arrives (Partial)
};

c10::intrusive_ptr<GatheredKernel> gathered_kernel(const DTensor& w, const Placements& use,
                                                   const Placements& grads) {
  auto k = c10::make_intrusive<GatheredKernel>();
  k->mesh = w.mesh();
  k->placements = w.placements();
  k->global_shape = w.sizes();
  k->use = use;
  k->grads = grads;
  return k;
}

at::Tensor gather_kernel(const GatheredKernel& k, const at::Tensor& local) {
  return DTensor::from_local(local, *k.mesh, k.placements, k.global_shape)
      .redistribute(k.use)
      .to_local();
}

// The kernel's gradient in the layout the matmul used, sent back to its own shard
// (reduce-scatter where gathered, all-reduce where a replicated kernel's gradient is partial).
at::Tensor route_kernel_grad(const GatheredKernel& k, const at::Tensor& grad_used) {
  Placements own = k.placements;
  for (Placement& p : own) {
    if (is_partial(p)) p = Replicate{};
  }
  return DTensor::from_local(grad_used, *k.mesh, k.grads, k.global_shape)
      .redistribute(own)
      .to_local();
}

// y = x @ gather(w): saves only this rank's shard of w, gathering again in backward, and sends
// the kernel's gradient straight back to its shard (reduce-scatter).
class GatheredDense : public torch::autograd::Function<GatheredDense> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& w_shard, c10::intrusive_ptr<GatheredKernel> k) {
    ctx->save_for_backward({x, w_shard});
    ctx->saved_data["kernel"] = c10::IValue::make_capsule(k);
    ctx->saved_data["scopes"] = ScopeCapture::current().to_ivalue();
    return functional::dense(x, gather_kernel(*k, w_shard));
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto k =
        c10::static_intrusive_pointer_cast<GatheredKernel>(ctx->saved_data["kernel"].toCapsule());
    const ScopeLoan loan(ScopeCapture::from_ivalue(ctx->saved_data["scopes"]));
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor w = gather_kernel(*k, saved[1]);
    const at::Tensor g = grads[0].reshape({-1, w.numel() / w.size(0)});
    // Under CPU autocast the forward multiplied in the gradient's (low) dtype, and backward runs
    // outside autocast: the operands take that dtype here, as autocast's own matmul backward
    // gives (mixed fp32 / bf16 operands are an error for a GEMM oneDNN runs); the gradients
    // return in their inputs' dtypes, the kernel's reduced (scattered) in fp32 as on the plain
    // data-parallel path.
    const at::Tensor w2 = w.reshape({w.size(0), -1}).to(g.scalar_type());
    const at::Tensor x2 = x.reshape({-1, x.size(-1)}).to(g.scalar_type());
    const at::Tensor grad_x = mm_any(g, w2.t()).reshape(x.sizes()).to(x.scalar_type());
    const at::Tensor grad_w = mm_any(x2.t(), g).reshape(w.sizes()).to(w.scalar_type());
    return {grad_x, route_kernel_grad(*k, grad_w), at::Tensor()};
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------

at::Tensor dense(const at::Tensor& x, const at::Tensor& w,
                 const std::shared_ptr<fp8::GemmMeta>& fp8, const DeviceMesh* mesh,
                 const at::Tensor& bias, const std::vector<int64_t>* amax_dims) {
  auto with_bias = [&bias](const at::Tensor& y) { return bias.defined() ? y + bias : y; };
  if (fp8 != nullptr && fp8->frozen()) return with_bias(fp8::frozen_linear(x, *fp8));
  TE_CHECK(x.dim() >= 1 && w.dim() >= 2 && x.size(-1) == w.size(0), "dense: input ", x.sizes(),
           " and kernel ", w.sizes(),
           " do not contract (the input's last dim must equal the kernel's first)");
  std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end() - 1);
  out_shape.insert(out_shape.end(), w.sizes().begin() + 1, w.sizes().end());
  const at::Tensor w2 = w.reshape({w.size(0), -1});
  if (fp8 != nullptr && (fp8_enabled() || fp8_calibrating())) {
    return with_bias(fp8::linear(x, w2, fp8, mesh, nullptr, amax_dims).reshape(out_shape));
  }
  if (auto y = detail::onednn_linear(x, w2, bias)) return y->reshape(out_shape);
  if (!bias.defined()) return mm_any(x, w2).reshape(out_shape);
  if (const auto low = slow_cpu_gemm_dtype(x, w2)) {
    // In the GEMM's dtype, as addmm under autocast gives it.
    return mm_any(x, w2).reshape(out_shape) + bias.to(*low);
  }
  if (bias.numel() == w2.size(1)) {
    return at::addmm(bias.reshape({-1}), x.reshape({-1, w.size(0)}), w2).view(out_shape);
  }
  return with_bias(mm_any(x, w2).reshape(out_shape));
}

namespace {

// The layout a dense input's constraint asks it to take (its own when there is none).
Placements wanted_input_layout(const DTensor& x, const LogicalAxes& input_axes) {
  if (input_axes.empty()) return x.placements();
  TE_CHECK(static_cast<int64_t>(input_axes.size()) == x.dim(), "dense: ", input_axes.size(),
           " input axes ", to_string(input_axes), " for ", x.to_string());
  const DeviceMesh* mesh = current_mesh();
  if (mesh == nullptr) {
    validate_logical_axes(input_axes);
  } else if (auto resolved = resolve_placements(input_axes, *mesh)) {
    TE_CHECK(*mesh == x.mesh(), "dense: the input lives on ", x.mesh().to_string(),
             " but the current mesh is another (", mesh->to_string(), ")");
    return std::move(*resolved);
  }
  return x.placements();
}

// Per mesh dim: the layouts x and the kernel take for the matmul (xa, wa), their gradients'
// layouts (xg, wg) and the output's.
struct DensePlan {
  Placements xa, wa, out, xg, wg;
};

DensePlan plan_dense(const Placements& wanted, const DTensor& w, int64_t k) {
  const std::size_t n = wanted.size();
  DensePlan p{Placements(n), Placements(n), Placements(n), Placements(n), Placements(n)};
  auto& [xa, wa, out, xg, wg] = p;
  for (std::size_t m = 0; m < n; ++m) {
    const Placement& px = wanted[m];
    const Placement& pw = w.placements()[m];
    TE_CHECK(!is_partial(pw), "dense: kernel ", w.to_string(),
             " is Partial; reduce it before using it");
    const bool x_batch = is_shard(px) && std::get<Shard>(px).dim < k;
    if (is_shard(pw) && x_batch) {
      // FSDP: x is split by rows here, so the kernel (whichever dim it is split on) is gathered
      // for use and its gradient reduce-scattered back; activations never move.
      xa[m] = xg[m] = px;
      wa[m] = Replicate{};
      wg[m] = Partial{};
      out[m] = px;
    } else if (is_shard(pw) && std::get<Shard>(pw).dim >= 1) {
      // Column parallel: whole input, output sharded like the kernel's output dim.
      xa[m] = Replicate{};
      xg[m] = Partial{};
      wa[m] = wg[m] = pw;
      out[m] = Shard{k + std::get<Shard>(pw).dim - 1};
    } else if (is_shard(pw)) {
      // Row parallel (kernel split on K): x split on K (free when x is replicated), partial
      // sums out.
      xa[m] = xg[m] = Shard{k};
      wa[m] = wg[m] = pw;
      out[m] = Partial{};
    } else if (x_batch) {
      // Data parallel: the replicated kernel's gradient is a partial sum.
      xa[m] = xg[m] = px;
      wa[m] = Replicate{};
      wg[m] = Partial{};
      out[m] = px;
    } else if (is_partial(px) && (std::get<Partial>(px).op == ReduceOp::kSum ||
                                  std::get<Partial>(px).op == ReduceOp::kAvg)) {
      // Linear in x: partial in, partial out.
      xa[m] = px;
      xg[m] = Replicate{};
      wa[m] = Replicate{};
      wg[m] = Partial{};
      out[m] = px;
    } else {
      // x replicated (or sharded on K, or a max/min partial): use it whole.
      xa[m] = xg[m] = Replicate{};
      wa[m] = wg[m] = Replicate{};
      out[m] = Replicate{};
    }
  }
  return p;
}

// The kernel's local piece in the layout (wa) and gradient layout (wg) dense planned for it.
using KernelLocal = std::function<at::Tensor(const Placements& wa, const Placements& wg)>;

// A 2-D tensor's placements with its dims swapped.
Placements transposed(Placements p) {
  for (Placement& q : p) {
    if (auto* s = std::get_if<Shard>(&q)) s->dim = 1 - s->dim;
  }
  return p;
}

DTensor dense_with(const DTensor& x, const DTensor& w, const LogicalAxes& input_axes,
                   const std::shared_ptr<fp8::GemmMeta>& fp8, const KernelLocal& kernel_local) {
  check_same_mesh(x, w, "dense");
  TE_CHECK(x.dim() >= 1 && w.dim() >= 2 && x.size(-1) == w.size(0), "dense: input ", x.to_string(),
           " and kernel ", w.to_string(), " do not contract");
  const int64_t k = x.dim() - 1;  // x's contracted dim
  const DeviceMesh& mesh = x.mesh();
  const std::size_t n = static_cast<std::size_t>(mesh.ndim());
  const auto [xa, wa, out, xg, wg] = plan_dense(wanted_input_layout(x, input_axes), w, k);
  const at::Tensor x_local = x.redistribute(xa, xg).to_local();
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.insert(shape.end(), w.sizes().begin() + 1, w.sizes().end());
  bool gathers_kernel = false;
  for (std::size_t m = 0; m < n; ++m) {
    gathers_kernel = gathers_kernel || (is_shard(w.placements()[m]) && is_replicate(wa[m]));
  }
  if (fp8 != nullptr && !fp8->frozen() && fp8->holds_kernel() && fp8_enabled()) {
    // FP8 weights in training: the held codes move as the kernel would. FSDP gathers them (a
    // quarter of fp32's bytes) and reduce-scatters the gradient back to the master's shard;
    // elsewhere the codes are used as held and the master's layout change (none forward) carries
    // the gradient, so data-parallel sums go through GradientBuckets as on the plain path.
    if (!gathers_kernel) {
      const at::Tensor master = w.redistribute(wa, wg).to_local();
      return DTensor::from_local(fp8::linear(x_local, master, fp8, &mesh), mesh, out, shape);
    }
    const auto state = gathered_kernel(w, wa, wg);
    fp8::KernelMoves moves;
    moves.gather = [state](const at::Tensor& codes) { return gather_kernel(*state, codes); };
    moves.route_grad = [state](const at::Tensor& g) { return route_kernel_grad(*state, g); };
    return DTensor::from_local(fp8::linear(x_local, w.to_local(), fp8, &mesh, &moves), mesh, out,
                               shape);
  }
  // FP8 keeps the gathered kernel's codes for backward, so it takes the plain path.
  const bool use_fp8 = fp8 != nullptr && (fp8_enabled() || fp8_calibrating());
  if (gathers_kernel && !use_fp8) {
    // FSDP: the gathered kernel lives only for the matmul; backward gathers it again.
    return DTensor::from_local(
        GatheredDense::apply(x_local, w.to_local(), gathered_kernel(w, wa, wg)), mesh, out, shape);
  }
  const at::Tensor w_local = kernel_local(wa, wg);
  return DTensor::from_local(dense(x_local, w_local, use_fp8 ? fp8 : nullptr, &mesh), mesh, out,
                             shape);
}

}  // namespace

DTensor dense(const DTensor& x, const DTensor& w, const LogicalAxes& input_axes,
              const std::shared_ptr<fp8::GemmMeta>& fp8) {
  return dense_with(x, w, input_axes, fp8, [&](const Placements& wa, const Placements& wg) {
    return w.redistribute(wa, wg).to_local();
  });
}

DTensor dense_transposed(const DTensor& x, const DTensor& table) {
  TE_CHECK(table.dim() == 2, "dense_transposed: the table ", table.to_string(),
           " is not [rows, features]");
  const DTensor kernel =
      DTensor::from_local(table.to_local().t(), table.mesh(), transposed(table.placements()),
                          std::vector<int64_t>{table.size(1), table.size(0)});
  // The table's own layout change carries the gradient (to GradientBuckets, as a kernel's).
  return dense_with(x, kernel, {}, nullptr, [&](const Placements& wa, const Placements& wg) {
    return table.redistribute(transposed(wa), transposed(wg)).to_local().t();
  });
}

DTensor add_bias(const DTensor& y_in, const DTensor& b) {
  check_same_mesh(y_in, b, "add_bias");
  const DTensor y = reduced(y_in);
  TE_CHECK(b.dim() <= y.dim(), "add_bias: bias ", b.to_string(), " has more dims than ",
           y.to_string());
  for (int64_t i = 0; i < b.dim(); ++i) {
    TE_CHECK(b.size(i) == y.size(y.dim() - b.dim() + i), "add_bias: bias ", b.to_string(),
             " does not match the trailing dims of ", y.to_string());
  }
  const at::Tensor b_local = aligned_param(b, y.placements(), y.dim(), "add_bias");
  return DTensor::from_local(y.to_local() + b_local, y.mesh(), y.placements(), y.sizes());
}

// ---------------------------------------------------------------------------------------------

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta,
                      double epsilon, bool zero_centered_gamma, bool rms) {
  if (!rms) {
    const at::Tensor scale = zero_centered_gamma ? gamma + 1.0 : gamma;
    // LibTorch's fused kernel (forward and backward in one pass each: the element-wise form
    // costs several passes and autograd nodes). Statistics in fp32 for narrower inputs, as TE.
    const int64_t h = x.size(-1);
    if (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble) {
      return at::layer_norm(x, {h}, scale, beta, epsilon);
    }
    return at::layer_norm(x.to(at::kFloat), {h}, scale.to(at::kFloat),
                          beta.defined() ? beta.to(at::kFloat) : beta, epsilon)
        .to(x.scalar_type());
  }
  // Llama's RMSNorm casts before the scale, the zero-centered one (Gemma's, TE's) after it.
  const at::Tensor y = detail::rms_norm(x, gamma, epsilon, zero_centered_gamma);
  return beta.defined() ? y + beta : y;
}

DTensor layer_norm(const DTensor& x_in, const DTensor& gamma, const std::optional<DTensor>& beta,
                   double epsilon, bool zero_centered_gamma, bool rms) {
  check_same_mesh(x_in, gamma, "layer_norm");
  // Normalisation needs the whole hidden dim of each row, and real (not partial) values.
  const int64_t last = x_in.dim() - 1;
  const DTensor x = replicated_where(
      x_in, [last](const Placement& p, std::size_t) { return is_partial(p) || is_shard(p, last); });
  const at::Tensor g = aligned_param(gamma, x.placements(), x.dim(), "layer_norm");
  const at::Tensor b =
      beta ? aligned_param(*beta, x.placements(), x.dim(), "layer_norm") : at::Tensor();
  return DTensor::from_local(layer_norm(x.to_local(), g, b, epsilon, zero_centered_gamma, rms),
                             x.mesh(), x.placements(), x.sizes());
}

// ---------------------------------------------------------------------------------------------

at::Tensor activation(const at::Tensor& x, const std::string& name,
                      const ActivationParams& params) {
  // LibTorch 1.13 lacks some CPU fp16 kernels (gelu among them): compute those in fp32.
  if (x.scalar_type() == at::kHalf && x.device().is_cpu() && name != "linear") {
    return activation(x.to(at::kFloat), name, params).to(at::kHalf);
  }
  if (name == "gelu") {
    // The tanh form (jax.nn.gelu(approximate=True), TE's default): at::gelu(x, "tanh"), on CPU
    // fp32 and bf16 through te's kernel (activation_cpu.cpp says why).
    return detail::gelu_tanh(x);
  }
  // The erf form (torch's default, BERT's and transformers' "gelu").
  if (name == "gelu_exact") return at::gelu(x);
  if (name == "relu") return at::relu(x);
  if (name == "silu") return detail::silu(x);  // te's kernel on CPU fp32 and bf16
  if (name == "quick_gelu") return x * at::sigmoid(1.702 * x);
  if (name == "squared_relu") return at::relu(x).pow(2);
  if (name == "sigmoid") return at::sigmoid(x);
  if (name == "linear") return x;
  if (name == "clamped_silu") {
    const at::Tensor c = x.clamp_max(params.limit);
    return c * at::sigmoid(params.alpha * c);
  }
  if (name == "clamped_linear") {
    return x.clamp(-params.limit, params.limit) + params.glu_linear_offset;
  }
  TE_FAIL(
      "activation '", name,
      "' is not one of gelu, gelu_exact, relu, silu, quick_gelu, squared_relu, sigmoid, linear, "
      "clamped_silu, clamped_linear (or, alone, a TE-PyTorch name: geglu, qgelu, qgeglu, "
      "reglu, srelu, sreglu, swiglu, glu, clamped_swiglu)");
}

std::vector<std::string> activation_slots(const std::vector<std::string>& activations) {
  TE_CHECK(!activations.empty(), "mlp activations: none given; use e.g. {\"gelu\"}");
  // TE-PyTorch's names (layernorm_mlp.py's activation, its kernels in
  // transformer_engine/common/util/math.h at d0067d0da) as TE-JAX slot lists.
  static const std::vector<std::pair<std::string, std::vector<std::string>>> kPyTorch = {
      {"geglu", {"gelu", "linear"}},
      {"qgelu", {"quick_gelu"}},
      {"qgeglu", {"quick_gelu", "linear"}},
      {"reglu", {"relu", "linear"}},
      {"srelu", {"squared_relu"}},
      {"sreglu", {"squared_relu", "linear"}},
      {"swiglu", {"silu", "linear"}},
      {"glu", {"sigmoid", "linear"}},
      {"clamped_swiglu", {"clamped_silu", "clamped_linear"}}};
  for (const auto& [name, slots] : kPyTorch) {
    for (const std::string& a : activations) {
      if (a != name) continue;
      TE_CHECK(activations.size() == 1, "mlp activations: '", name,
               "' is a whole TE-PyTorch activation (", slots.size(),
               " slots); give it alone, or give TE-JAX's slots instead");
      return slots;
    }
  }
  for (const std::string& a : activations) activation(at::zeros({1}), a);  // names a slot
  return activations;
}

at::Tensor mlp_activation(const at::Tensor& h, const std::vector<std::string>& activations_in,
                          const ActivationParams& params) {
  const std::vector<std::string> activations = activation_slots(activations_in);
  TE_CHECK(h.dim() >= 2 && h.size(-2) == static_cast<int64_t>(activations.size()),
           "mlp_activation: ", activations.size(), " activations for a tensor of shape ", h.sizes(),
           " (its second-to-last dim holds one slot per activation)");
  // One slot: a view whose backward is a view too (select's backward writes its gradient into a
  // zero-filled tensor of the input's shape: a whole extra pass over the activations).
  if (activations.size() == 1) return activation(h.squeeze(-2), activations[0], params);
  const std::vector<at::Tensor> slots = h.unbind(-2);
  at::Tensor out = activation(slots[0], activations[0], params);
  for (std::size_t i = 1; i < activations.size(); ++i) {
    out = out * activation(slots[i], activations[i], params);
  }
  return out;
}

DTensor mlp_activation(const DTensor& h_in, const std::vector<std::string>& activations,
                       const ActivationParams& params) {
  // The activation slots whole (the slots combine), real values; the dim after the slots takes
  // the slot dim's place.
  const int64_t slot = h_in.dim() - 2;
  const DTensor src = replicated_where(
      h_in, [slot](const Placement& p, std::size_t) { return is_partial(p) || is_shard(p, slot); });
  Placements out = src.placements();
  for (Placement& p : out) {
    if (is_shard(p, slot + 1)) p = Shard{slot};
  }
  std::vector<int64_t> shape = src.sizes();
  shape.erase(shape.begin() + slot);
  return DTensor::from_local(mlp_activation(src.to_local(), activations, params), src.mesh(), out,
                             shape);
}

// ---------------------------------------------------------------------------------------------

at::Tensor select(const at::Tensor& x, int64_t dim, int64_t index) { return x.select(dim, index); }

at::Tensor unflatten(const at::Tensor& x, int64_t dim, int64_t outer, int64_t inner) {
  TE_CHECK(x.size(dim) == outer * inner, "unflatten: dim ", dim, " of ", x.sizes(), " is not ",
           outer, " x ", inner);
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape[static_cast<std::size_t>(dim)] = outer;
  shape.insert(shape.begin() + dim + 1, inner);
  return x.reshape(shape);
}

at::Tensor flatten(const at::Tensor& x, int64_t dim) { return x.flatten(dim, dim + 1); }

at::Tensor soft_cap(const at::Tensor& x, double cap) {
  const at::Tensor scaled = x / cap;
  // LibTorch 1.13 has no CPU tanh for Half: in fp32 and rounded back, as Half kernels compute it.
  const at::Tensor t = scaled.scalar_type() == at::kHalf && scaled.is_cpu()
                           ? at::tanh(scaled.to(at::kFloat)).to(at::kHalf)
                           : at::tanh(scaled);
  return t * cap;
}

at::Tensor add(const at::Tensor& a, const at::Tensor& b) {
  TE_CHECK(a.sizes() == b.sizes(), "add: ", a.sizes(), " and ", b.sizes(), " differ in shape");
  return a + b;
}

}  // namespace te::nn::functional
