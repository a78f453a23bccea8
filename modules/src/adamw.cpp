// te::optim::AdamW with fp32 master weights, and the weight-decay groups (see adamw.h).

#include "te/optim/adamw.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>
#include "te/runtime/parallel.h"

#include <cmath>
#include <map>
#include <memory>
#include <type_traits>
#include <utility>

#include "te/compat.h"
#include "te/distributed/dtensor.h"
#include "te/error.h"
#include "te/nn/sharded.h"

namespace te::optim {

namespace {

void check_options(const AdamWOptions& o, const std::string& where) {
  TE_CHECK(o.lr() >= 0, "AdamW: lr ", o.lr(), where, " is negative");
  TE_CHECK(o.eps() >= 0, "AdamW: eps ", o.eps(), where, " is negative");
  TE_CHECK(o.weight_decay() >= 0, "AdamW: weight_decay ", o.weight_decay(), where, " is negative");
  const auto [beta1, beta2] = o.betas();
  TE_CHECK(beta1 >= 0 && beta1 < 1, "AdamW: beta1 ", beta1, where, " is outside [0, 1)");
  TE_CHECK(beta2 >= 0 && beta2 < 1, "AdamW: beta2 ", beta2, where, " is outside [0, 1)");
}

bool low_precision(const at::Tensor& p) {
  return p.scalar_type() == at::kBFloat16 || p.scalar_type() == at::kHalf;
}

// The step's scalars in fp32, as LibTorch's fp32 kernels take them.
struct StepScalars {
  bool decays;
  float decay, w1, b2, c2, bc2_sqrt, eps, neg_step;
};

// update()'s ops in one pass over each element, in fp32, each rounded as LibTorch's vectorised
// kernel rounds it (lerp's is a fused multiply-add; addcmul and addcdiv evaluate left to right,
// uncontracted: this file is compiled with -ffp-contract=off), so that the step is the ops' to
// the bit: read the weight, gradient and moments once and write them once, where the ops read
// and wrote each up to eight times (a quarter of a bf16 SmolLM2 step's non-GEMM time). `low`:
// the bf16 or fp16 parameter beside its master, written rounded to nearest (TE's FusedAdam's
// copy), or null.
#if defined(__GNUC__)
#define TE_ADAM_INLINE __attribute__((always_inline)) inline
#else
#define TE_ADAM_INLINE inline
#endif
template <typename G, typename L>
TE_ADAM_INLINE void fused_loop(float* w, float* m, float* v, const G* g, L* low, int64_t n,
                               const StepScalars& s) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = static_cast<float>(g[i]);
    const float wi = s.decays ? w[i] * s.decay : w[i];
    const float mi = std::fma(s.w1, gi - m[i], m[i]);  // lerp_(grad, 1 - beta1): weight < 1/2
    const float vi = v[i] * s.b2 + s.c2 * gi * gi;     // mul_(beta2).addcmul_(g, g, 1 - beta2)
    const float denom = std::sqrt(vi) / s.bc2_sqrt + s.eps;
    const float wn = wi + s.neg_step * mi / denom;  // addcdiv_(m, denom, -step_size)
    m[i] = mi;
    v[i] = vi;
    w[i] = wn;
    if constexpr (!std::is_same_v<L, float>) low[i] = static_cast<L>(wn);
  }
}

// The loops this CPU runs best: x86-64 builds also compile them for AVX2 + FMA and AVX-512
// (function multiversioning; the baseline's fma is a library call).
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__)
#define TE_ADAM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TE_ADAM_CLONES
#endif
struct Moments {
  float *w, *m, *v;
};
TE_ADAM_CLONES void loop_f32(Moments x, const float* g, int64_t n, const StepScalars& s) {
  fused_loop(x.w, x.m, x.v, g, static_cast<float*>(nullptr), n, s);
}
TE_ADAM_CLONES void loop_bf16(Moments x, const at::BFloat16* g, at::BFloat16* low, int64_t n,
                              const StepScalars& s) {
  if (low == nullptr) return fused_loop(x.w, x.m, x.v, g, static_cast<float*>(nullptr), n, s);
  fused_loop(x.w, x.m, x.v, g, low, n, s);
}
TE_ADAM_CLONES void loop_f16(Moments x, const at::Half* g, at::Half* low, int64_t n,
                             const StepScalars& s) {
  if (low == nullptr) return fused_loop(x.w, x.m, x.v, g, static_cast<float*>(nullptr), n, s);
  fused_loop(x.w, x.m, x.v, g, low, n, s);
}

// The fused step where it applies: contiguous CPU fp32 weight and moments, a contiguous CPU
// gradient of fp32, bf16 or fp16, 1 - beta1 below 1/2 (lerp's first form), and `low` (if
// defined) a contiguous bf16 or fp16 tensor of the weight's size. False elsewhere (update()'s
// ops then run).
bool fused_update(at::Tensor& weight, const at::Tensor& grad, AdamWParamState& st,
                  const StepScalars& s, double beta1, const at::Tensor& low) {
  const at::Tensor &m = st.exp_avg(), &v = st.exp_avg_sq();
  const auto cpu_float = [&](const at::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
           t.numel() == weight.numel();
  };
  const auto cpu_any = [&](const at::Tensor& t) {
    const at::ScalarType type = t.scalar_type();
    return t.device().is_cpu() && t.is_contiguous() && t.numel() == weight.numel() &&
           (type == at::kFloat || type == at::kBFloat16 || type == at::kHalf);
  };
  if (!cpu_float(weight) || !cpu_float(m) || !cpu_float(v) || !cpu_any(grad) ||
      (low.defined() && (!cpu_any(low) || low.scalar_type() == at::kFloat)) || 1 - beta1 >= 0.5) {
    return false;
  }
  // The low-precision output matches the gradient's dtype (a bf16 parameter's master).
  TE_CHECK(!low.defined() || low.scalar_type() == grad.scalar_type(), "AdamW: a ",
           grad.scalar_type(), " gradient for a ", low.scalar_type(), " parameter");
  const Moments x{weight.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>()};
  const at::ScalarType type = grad.scalar_type();
  at::parallel_for(0, weight.numel(), int64_t{1} << 15, [&](int64_t first, int64_t last) {
    const Moments here{x.w + first, x.m + first, x.v + first};
    const int64_t n = last - first;
    if (type == at::kFloat) {
      loop_f32(here, grad.data_ptr<float>() + first, n, s);
    } else if (type == at::kBFloat16) {
      loop_bf16(here, grad.data_ptr<at::BFloat16>() + first,
                low.defined() ? low.data_ptr<at::BFloat16>() + first : nullptr, n, s);
    } else {
      loop_f16(here, grad.data_ptr<at::Half>() + first,
               low.defined() ? low.data_ptr<at::Half>() + first : nullptr, n, s);
    }
  });
  return true;
}

// One parameter's update: torch 2.11's _single_tensor_adam with amsgrad off and decoupled
// decay, op for op, on fp32 tensors (the master, or the fp32 parameter itself), fused into one
// pass on the CPU (fused_update); `low` gets the result rounded where defined.
void update(at::Tensor& weight, const at::Tensor& grad, AdamWParamState& st, const AdamWOptions& o,
            at::Tensor& scratch, const at::Tensor& low = {}) {
  const auto [beta1, beta2] = o.betas();
  st.step(st.step() + 1);
  const double step = static_cast<double>(st.step());
  const double bias_correction1 = 1 - std::pow(beta1, step);
  const double bias_correction2 = 1 - std::pow(beta2, step);
  const double step_size = o.lr() / bias_correction1;
  const double bias_correction2_sqrt = std::pow(bias_correction2, 0.5);
  const StepScalars s{
      o.weight_decay() != 0,         static_cast<float>(1 - o.lr() * o.weight_decay()),
      static_cast<float>(1 - beta1), static_cast<float>(beta2),
      static_cast<float>(1 - beta2), static_cast<float>(bias_correction2_sqrt),
      static_cast<float>(o.eps()),   static_cast<float>(-step_size)};
  if (fused_update(weight, grad, st, s, beta1, low)) return;
  const at::Tensor g = grad.scalar_type() == weight.scalar_type() ? grad : grad.to(at::kFloat);
  if (o.weight_decay() != 0) weight.mul_(1 - o.lr() * o.weight_decay());
  st.exp_avg().lerp_(g, 1 - beta1);
  st.exp_avg_sq().mul_(beta2).addcmul_(g, g, 1 - beta2);
  // (sqrt(v) / sqrt(bc2)) + eps, the same kernels as torch's out-of-place ops, written into one
  // buffer for the step's parameters (two new tensors per parameter cost their page faults).
  const at::Tensor& v = st.exp_avg_sq();
  if (!scratch.defined() || scratch.scalar_type() != v.scalar_type() ||
      scratch.device() != v.device() || scratch.numel() < v.numel()) {
    scratch = at::empty({v.numel()}, v.options());
  }
  at::Tensor denom = scratch.narrow(0, 0, v.numel()).view(v.sizes());
  at::sqrt_out(denom, v);
  denom.div_(bias_correction2_sqrt).add_(o.eps());
  weight.addcdiv_(st.exp_avg(), denom, -step_size);
  if (low.defined()) low.copy_(weight);  // rounded to nearest, as TE's FusedAdam writes it
}

}  // namespace

AdamW::AdamW(std::vector<torch::optim::OptimizerParamGroup> param_groups, AdamWOptions defaults)
    : torch::optim::Optimizer(std::move(param_groups), std::make_unique<AdamWOptions>(defaults)) {
  check_options(defaults, "");
  std::map<const void*, std::size_t> group_of;
  for (std::size_t i = 0; i < param_groups_.size(); ++i) {
    const auto* o = dynamic_cast<const AdamWOptions*>(&param_groups_[i].options());
    TE_CHECK(o != nullptr, "AdamW: parameter group ", i,
             " has another optimizer's options; give it te::optim::AdamWOptions");
    check_options(*o, " (parameter group " + std::to_string(i) + ")");
    for (const auto& p : param_groups_[i].params()) {
      const auto [it, added] = group_of.emplace(p.unsafeGetTensorImpl(), i);
      TE_CHECK(added, "AdamW: a parameter of shape ", p.sizes(), " is in parameter group ",
               it->second, " and again in group ", i, "; give each parameter once");
    }
  }
}

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions defaults)
    : AdamW({torch::optim::OptimizerParamGroup(std::move(params))}, std::move(defaults)) {}

AdamW::AdamW(const torch::nn::Module& module, const AdamWOptions& defaults,
             const NoDecayRule& no_decay, std::optional<ZeroSharding> zero)
    : AdamW(weight_decay_groups(module, defaults, no_decay), defaults) {
  if (zero) split_state(module, *zero);
}

void AdamW::split_state(const torch::nn::Module& module, const ZeroSharding& zero) {
  const DeviceMesh& mesh = zero.mesh;
  TE_CHECK(mesh.has_axis(zero.axis), "AdamW: ZeroSharding axis '", zero.axis,
           "' is not an axis of ", mesh.to_string(), "; give the data axis");
  const int64_t dim = mesh.axis_index(zero.axis);
  if (mesh.size(dim) == 1) return;  // one rank holds it all: nothing to split
  zero_mesh_ = mesh;
  const auto layouts = te::nn::named_parameter_layouts(module);
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!p.requires_grad()) continue;
    const auto layout = layouts.find(item.key());
    if (layout != layouts.end() && layout->second.mesh) {
      TE_CHECK(*layout->second.mesh == mesh, "AdamW: parameter '", item.key(), "' is laid out on ",
               layout->second.mesh->to_string(), ", not on the ZeroSharding mesh ",
               mesh.to_string(), "; give the mesh the model was built on");
      // Sharded over the axis already (FSDP): its state is laid out as it (ZeRO-3).
      if (is_shard(layout->second.placements[static_cast<std::size_t>(dim)])) continue;
    }
    TE_CHECK(p.is_contiguous(), "AdamW: parameter '", item.key(),
             "' is not contiguous; ZeroSharding splits parameters by their flat elements");
    Split split;
    split.numel = p.numel();
    // The flattened local piece, split over the ZeRO axis alone: within each row of that axis
    // (the ranks holding the same piece under the other mesh dims) the chunks are torch.chunk's.
    split.placements.assign(static_cast<std::size_t>(mesh.ndim()), Replicate{});
    split.placements[static_cast<std::size_t>(dim)] = Shard{0};
    const Chunk chunk = local_chunks({split.numel}, mesh, split.placements, mesh.rank()).at(0);
    split.piece = {chunk.offset, chunk.length};
    splits_.emplace(p.unsafeGetTensorImpl(), std::move(split));
  }
}

std::optional<AdamW::Piece> AdamW::state_piece(const at::Tensor& param) const {
  const auto it = splits_.find(param.unsafeGetTensorImpl());
  if (it == splits_.end()) return std::nullopt;
  return it->second.piece;
}

at::Tensor AdamW::gather(const Split& split, const at::Tensor& chunk) const {
  return DTensor::from_local(chunk, *zero_mesh_, split.placements,
                             std::vector<int64_t>{split.numel})
      .full_tensor();
}

at::Tensor AdamW::gather_state(const at::Tensor& param, const at::Tensor& chunk) const {
  const auto it = splits_.find(param.unsafeGetTensorImpl());
  TE_CHECK(it != splits_.end(), "AdamW::gather_state: a parameter of shape ", param.sizes(),
           " whose state is not split (ZeroSharding)");
  at::NoGradGuard no_grad;
  return gather(it->second, chunk).view(param.sizes());
}

AdamWParamState* AdamW::state_of(const at::Tensor& param, bool create) {
  using Key = typename std::decay_t<decltype(state_)>::key_type;
  const Key key = compat::optimizer_state_key<Key>(param.unsafeGetTensorImpl());
  auto it = state_.find(key);
  if (it == state_.end()) {
    if (!create) return nullptr;
    const AdamWOptions* options = nullptr;
    for (const auto& group : param_groups_) {
      for (const auto& p : group.params()) {
        if (p.is_same(param)) options = dynamic_cast<const AdamWOptions*>(&group.options());
      }
    }
    TE_CHECK(options != nullptr, "AdamW: a parameter of shape ", param.sizes(),
             " that is in none of the optimizer's groups");
    const bool master = low_precision(param) && options->master_weights();
    auto st = std::make_unique<AdamWParamState>();
    // The moments in fp32 beside a master, else in the parameter's dtype (as torch keeps them);
    // under ZeroSharding, this rank's chunk of the flattened parameter.
    const std::optional<Piece> piece = state_piece(param);
    const at::Tensor own =
        piece ? param.detach().view(-1).narrow(0, piece->offset, piece->length) : param.detach();
    const auto moments = param.options().dtype(master ? at::kFloat : param.scalar_type());
    st->exp_avg(at::zeros(own.sizes(), moments));
    st->exp_avg_sq(at::zeros(own.sizes(), moments));
    if (master) st->master(own.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true));
    it = state_.emplace(key, std::move(st)).first;
  }
  return static_cast<AdamWParamState*>(it->second.get());
}

at::Tensor AdamW::step(LossClosure closure) {
  at::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  at::NoGradGuard no_grad;
  at::Tensor scratch;  // the denominators, one parameter at a time
  for (std::size_t g = 0; g < param_groups_.size(); ++g) {
    // A group added later (add_param_group) was not checked by the constructor.
    const auto* options = dynamic_cast<const AdamWOptions*>(&param_groups_[g].options());
    TE_CHECK(options != nullptr, "AdamW: parameter group ", g,
             " has another optimizer's options; give it te::optim::AdamWOptions");
    const AdamWOptions& o = *options;
    for (auto& p : param_groups_[g].params()) {
      if (!p.grad().defined()) continue;
      const at::Tensor& grad = p.grad();
      TE_CHECK(!grad.is_sparse(), "AdamW: parameter ", p.sizes(), " of group ", g,
               " has a sparse gradient; AdamW takes dense ones");
      TE_CHECK(grad.sizes() == p.sizes(), "AdamW: a gradient of shape ", grad.sizes(),
               " for parameter ", p.sizes(), " of group ", g, "; it must be the parameter's");
      TE_CHECK(grad.scalar_type() == p.scalar_type(), "AdamW: a ", grad.scalar_type(),
               " gradient for a ", p.scalar_type(), " parameter ", p.sizes(), " of group ", g,
               "; it must be the parameter's dtype");
      AdamWParamState& st = *state_of(p, /*create=*/true);
      const bool master = st.master().defined();
      const auto split = splits_.find(p.unsafeGetTensorImpl());
      if (split == splits_.end()) {
        at::Tensor weight = master ? st.master() : p;
        // (bf16 and fp16 gradients widen to fp32 exactly.)
        update(weight, grad, st, o, scratch, master ? p : at::Tensor());
        continue;
      }
      // ZeRO-1: this rank's chunk from the whole gradient, then every rank's chunk gathered.
      const Piece& piece = split->second.piece;
      const at::Tensor g = grad.reshape(-1).narrow(0, piece.offset, piece.length);
      at::Tensor weight = master ? st.master() : p.view(-1).narrow(0, piece.offset, piece.length);
      update(weight, g, st, o, scratch);
      const at::Tensor chunk = master ? st.master().to(p.scalar_type()) : weight;
      p.view(-1).copy_(gather(split->second, chunk));
    }
  }
  return loss;
}

void AdamW::save(torch::serialize::OutputArchive&) const {
  TE_FAIL(
      "te::optim::AdamW: a torch::serialize archive would lose the state's layout; save "
      "with te::nn::save_checkpoint(module, dir, extra, &optimizer)");
}

void AdamW::load(torch::serialize::InputArchive&) {
  TE_FAIL(
      "te::optim::AdamW: load with te::nn::load_checkpoint(module, dir, options, "
      "&optimizer)");
}

bool default_no_decay(const std::string& name, const std::vector<int64_t>& global_shape) {
  if (global_shape.size() < 2) return true;
  const std::size_t dot = name.rfind('.');
  const std::string last = dot == std::string::npos ? name : name.substr(dot + 1);
  const std::string suffix = "bias";
  return last.size() >= suffix.size() &&
         last.compare(last.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<torch::optim::OptimizerParamGroup> weight_decay_groups(const torch::nn::Module& module,
                                                                   const AdamWOptions& options,
                                                                   const NoDecayRule& no_decay) {
  check_options(options, "");
  TE_CHECK(static_cast<bool>(no_decay),
           "weight_decay_groups: no_decay is empty; give a rule "
           "(te::optim::default_no_decay)");
  const auto layouts = te::nn::named_parameter_layouts(module);
  std::vector<at::Tensor> decayed, kept;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!item.value().requires_grad()) continue;
    const auto layout = layouts.find(item.key());
    const std::vector<int64_t> shape =
        layout != layouts.end()
            ? layout->second.global_shape
            : std::vector<int64_t>(item.value().sizes().begin(), item.value().sizes().end());
    (no_decay(item.key(), shape) ? kept : decayed).push_back(item.value());
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decayed.empty()) {
    groups.emplace_back(std::move(decayed), std::make_unique<AdamWOptions>(options));
  }
  if (!kept.empty()) {
    groups.emplace_back(std::move(kept),
                        std::make_unique<AdamWOptions>(AdamWOptions(options).weight_decay(0)));
  }
  return groups;
}

}  // namespace te::optim
