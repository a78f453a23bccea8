// LayerNormMoE (te/nn/moe_layer.h): the norm, the router, the routed experts (moe_experts.h) and
// the shared expert.

#include "te/nn/moe_layer.h"

#include <ATen/ATen.h>

#include <numeric>
#include <optional>
#include <string>

#include "forward.h"
#include "moe_experts.h"
#include "te/distributed/ops.h"
#include "te/error.h"
#include "te/fp8.h"
#include "te/nn/init.h"
#include "te/nn/random.h"
#include "te/scope_stack.h"

namespace te::nn {

namespace F = functional;
using Placements = std::vector<Placement>;

LayerNormMoEImpl::LayerNormMoEImpl(const LayerNormMoEOptions& options_) : options(options_) {
  reset();
}

void LayerNormMoEImpl::reset() {
  const LayerNormMoEOptions& o = options;
  const int64_t h = o.hidden_size(), f = o.ffn_hidden_size(), e = o.num_experts();
  TE_CHECK(h > 0 && f > 0 && e > 0, "LayerNormMoE: hidden_size (", h, "), ffn_hidden_size (", f,
           ") and num_experts (", e, ") must be positive");
  TE_CHECK(o.router().topk >= 1 && o.router().topk <= e, "LayerNormMoE: router topk ",
           o.router().topk, " is not in [1, ", e, "] (num_experts)");
  TE_CHECK(!o.activations().empty(), "LayerNormMoE: activations is empty; use e.g. {\"silu\", ",
           "\"linear\"}");
  TE_CHECK(o.layernorm().hidden_size() == h, "LayerNormMoE: the norm's hidden_size ",
           o.layernorm().hidden_size(), " differs from hidden_size ", h);
  TE_CHECK(o.intermediate_dropout_rate() >= 0 && o.intermediate_dropout_rate() < 1,
           "LayerNormMoE: intermediate_dropout_rate ", o.intermediate_dropout_rate(),
           " is not in [0, 1)");
  TE_CHECK(o.shared_expert_size() >= 0, "LayerNormMoE: shared_expert_size ", o.shared_expert_size(),
           " is negative (0: no shared expert)");
  TE_CHECK(!o.shared_expert_gate() || o.shared_expert_size() > 0,
           "LayerNormMoE: shared_expert_gate needs a shared expert (shared_expert_size > 0)");
  TE_CHECK(o.aux_loss_coeff() >= 0 && o.z_loss_coeff() >= 0, "LayerNormMoE: aux_loss_coeff (",
           o.aux_loss_coeff(), ") and z_loss_coeff (", o.z_loss_coeff(), ") must not be negative");
  const int64_t a = static_cast<int64_t>(F::activation_slots(o.activations()).size());
  layernorm = register_module("layernorm", LayerNorm(o.layernorm()));
  gate_kernel = register_sharded(*this, "gate_kernel",
                                 variance_scaling({h, e}, 1, 1.0, "fan_in", "truncated_normal"),
                                 o.gate_kernel_axes());
  gate_bias = o.router_bias()
                  ? register_sharded(*this, "gate_bias", at::zeros({e}), axis::replicated_1d())
                  : at::Tensor();
  // Each expert's kernels initialised as one LayerNormMLP's, expert by expert.
  std::vector<at::Tensor> wi, wo;
  for (int64_t i = 0; i < e; ++i) {
    wi.push_back(variance_scaling({h, a, f}, 1, 1.0, "fan_in", "truncated_normal"));
    wo.push_back(variance_scaling({f, h}, 1, 1.0, "fan_in", "truncated_normal"));
  }
  wi_kernel = register_sharded(*this, "wi_kernel", at::stack(wi), o.wi_kernel_axes());
  wo_kernel = register_sharded(*this, "wo_kernel", at::stack(wo), o.wo_kernel_axes());
  if (o.use_bias()) {
    wi_bias = register_sharded(*this, "wi_bias", at::zeros({e, a, f}), o.wi_bias_axes());
    wo_bias = register_sharded(*this, "wo_bias", at::zeros({e, h}), o.wo_bias_axes());
  } else {
    wi_bias = wo_bias = at::Tensor();
  }
  const int64_t s = o.shared_expert_size();
  shared_wi_kernel = shared_wo_kernel = shared_gate_kernel = at::Tensor();
  if (s > 0) {
    shared_wi_kernel =
        register_sharded(*this, "shared_wi_kernel",
                         variance_scaling({h, a, s}, 1, 1.0, "fan_in", "truncated_normal"),
                         o.shared_kernel_axes_1());
    shared_wo_kernel = register_sharded(
        *this, "shared_wo_kernel", variance_scaling({s, h}, 1, 1.0, "fan_in", "truncated_normal"),
        o.shared_kernel_axes_2());
    if (o.shared_expert_gate()) {
      shared_gate_kernel =
          register_sharded(*this, "shared_gate_kernel",
                           variance_scaling({h, 1}, 1, 1.0, "fan_in", "truncated_normal"),
                           {axis::kWFsdp, axis::kWNoShard});
    }
  }
  shared_wi_fp8 = s > 0 ? register_fp8_gemm(*this, "shared_wi_") : nullptr;
  shared_wo_fp8 = s > 0 ? register_fp8_gemm(*this, "shared_wo_") : nullptr;
  wi_fp8.clear();
  wo_fp8.clear();
  for (int64_t i = 0; i < e; ++i) {
    wi_fp8.push_back(register_fp8_gemm(*this, "wi_" + std::to_string(i) + "_"));
    wo_fp8.push_back(register_fp8_gemm(*this, "wo_" + std::to_string(i) + "_"));
  }
}

void LayerNormMoEImpl::forget_member(const std::string& name) {
  const std::pair<const char*, at::Tensor*> kernels[] = {{"wi_kernel", &wi_kernel},
                                                         {"wo_kernel", &wo_kernel},
                                                         {"shared_wi_kernel", &shared_wi_kernel},
                                                         {"shared_wo_kernel", &shared_wo_kernel}};
  for (const auto& [kernel_name, kernel] : kernels) {
    if (name == kernel_name) {
      *kernel = at::Tensor();
      return;
    }
  }
  ShardedModule::forget_member(name);
}

void LayerNormMoEImpl::pretty_print(std::ostream& stream) const {
  stream << "te::nn::LayerNormMoE(hidden_size=" << options.hidden_size()
         << ", ffn_hidden_size=" << options.ffn_hidden_size()
         << ", num_experts=" << options.num_experts() << ", topk=" << options.router().topk
         << ", shared_expert_size=" << options.shared_expert_size() << ")";
}

namespace {

// a * sigmoid(gate), gate [..., 1].
at::Tensor gated(const at::Tensor& a, const at::Tensor& gate) { return a * at::sigmoid(gate); }
DTensor gated(const DTensor& a_in, const DTensor& gate_in) {
  // The gate broadcasts over the hidden dim: whole there wherever `a` is split on it.
  // Each rank's gradient of the gate is then its hidden slice's share: a partial sum.
  const DTensor a = reduced(a_in);
  Placements where = a.placements(), grads = a.placements();
  for (std::size_t m = 0; m < where.size(); ++m) {
    if (is_shard(where[m]) && std::get<Shard>(where[m]).dim == a.dim() - 1) {
      where[m] = Replicate{};
      grads[m] = Partial{};
    }
  }
  const DTensor gate = reduced(gate_in).redistribute(where, grads);
  return DTensor::from_local(gated(a.to_local(), gate.to_local()), a.mesh(), a.placements(),
                             a.sizes());
}

template <typename T>
struct MoEOut {
  T out, ln, aux;
};

// LayerNormMoE's one forward (modules/src/forward.h).
template <typename T>
MoEOut<T> moe_forward(LayerNormMoEImpl& self, const T& input) {
  detail::enter(self, "LayerNormMoE", input);
  const LayerNormMoEOptions& o = self.options;
  const T ln = self.layernorm->forward(constrain(input, o.layernorm_input_axes()));
  const T x = constrain(ln, o.dot_1_input_axes());
  // The router stays in high precision under an FP8 recipe (as Megatron's, a plain Linear): a
  // quantized logit would move tokens between experts.
  const T logits =
      detail::project(self, x, "gate_", self.gate_kernel, self.gate_bias, nullptr, {}, {});
  auto [out, aux] = detail::moe_experts(self, x, logits);
  if (o.shared_expert_size() > 0) {  // (its kernels may be held in blocks, released)
    const T h = detail::project(self, x, "shared_wi_", self.shared_wi_kernel, at::Tensor(),
                                self.shared_wi_fp8, {}, {});
    T act = F::mlp_activation(h, o.activations(), o.activation_params());
    act = F::dropout(act, o.intermediate_dropout_rate(), self.is_training());
    T shared = detail::project(self, act, "shared_wo_", self.shared_wo_kernel, at::Tensor(),
                               self.shared_wo_fp8, {}, {});
    if (o.shared_expert_gate()) {
      shared = gated(shared, detail::project(self, x, "shared_gate_", self.shared_gate_kernel,
                                             at::Tensor(), nullptr, {}, {}));
    }
    out = F::add(shared, out);  // the experts' partial sums (tp, ep) into the shared layout
  }
  return {constrain(out, o.output_axes()), ln, aux};
}

}  // namespace

at::Tensor LayerNormMoEImpl::forward(const at::Tensor& input) {
  return moe_forward(*this, input).out;
}
DTensor LayerNormMoEImpl::forward(const DTensor& input) { return moe_forward(*this, input).out; }
std::pair<at::Tensor, at::Tensor> LayerNormMoEImpl::forward_with_layernorm_output(
    const at::Tensor& input) {
  auto r = moe_forward(*this, input);
  return {r.out, r.ln};
}
std::pair<DTensor, DTensor> LayerNormMoEImpl::forward_with_layernorm_output(const DTensor& input) {
  auto r = moe_forward(*this, input);
  return {r.out, r.ln};
}
std::pair<at::Tensor, at::Tensor> LayerNormMoEImpl::forward_with_aux_loss(const at::Tensor& input) {
  auto r = moe_forward(*this, input);
  return {r.out, r.aux};
}
std::pair<DTensor, DTensor> LayerNormMoEImpl::forward_with_aux_loss(const DTensor& input) {
  auto r = moe_forward(*this, input);
  return {r.out, r.aux};
}

namespace {

// The RouterLoadScopes open on this thread (te/scope_stack.h).
ScopeStack<RouterLoadScope*>& load_scopes() {
  thread_local ScopeStack<RouterLoadScope*> stack;
  return stack;
}

}  // namespace

RouterLoadScope::RouterLoadScope() { load_scopes().push(this, this); }
RouterLoadScope::~RouterLoadScope() { load_scopes().pop(this); }
RouterLoadScope* RouterLoadScope::current() { return load_scopes().top_or(nullptr); }

at::Tensor load_balancing_loss(const std::vector<RouterLoad>& loads) {
  TE_CHECK(!loads.empty(),
           "load_balancing_loss: no router load; run the model's forward inside the "
           "RouterLoadScope (a model without a mixture-of-experts layer records none)");
  const int64_t experts = loads.front().selected.numel();
  at::Tensor selected, scores, tokens;
  for (std::size_t l = 0; l < loads.size(); ++l) {
    const RouterLoad& r = loads[l];
    TE_CHECK(r.selected.numel() == experts && r.score_sums.numel() == experts,
             "load_balancing_loss: router load ", l, " has ", r.selected.numel(),
             " experts and load 0 has ", experts,
             "; take the loss over layers of one expert count");
    selected = l == 0 ? r.selected : selected + r.selected;
    scores = l == 0 ? r.score_sums : scores + r.score_sums;
    tokens = l == 0 ? r.tokens : tokens + r.tokens;
  }
  // No token at all: no load to balance (rather than 0 / 0).
  if (tokens.item<double>() == 0) return at::zeros({}, scores.options());
  return (selected / tokens * (scores / tokens)).sum() * static_cast<double>(experts);
}

}  // namespace te::nn
