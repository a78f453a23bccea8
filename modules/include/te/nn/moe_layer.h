#pragma once

// te::nn::LayerNormMoE: a mixture-of-experts MLP block (norm, router, experts, optional shared
// expert) in the idiom of LayerNormMLP, built from te/nn/moe.h's routing and permutation and
// GroupedLinear's grouped GEMM, its parameters laid out by logical axes as TE-JAX's MoE block
// keeps them (transformer_engine/jax/flax/moe.py at d0067d0da: gate [hidden, experts], wi
// [experts, hidden, mlp], wo [experts, mlp, hidden], the expert dim on the logical axis "exp",
// which TE's table gives MeshResource::ep).
//
// Example (Qwen3-MoE's block: 8 experts, 2 per token, probabilities renormalised):
//   auto o = te::nn::LayerNormMoEOptions(256, 128, 8).activations({"silu", "linear"});
//   o.router().topk = 2;  // use_pre_softmax false: the softmax over the chosen two
//   te::nn::LayerNormMoE moe(o);
//   at::Tensor y = moe(x);  // x [batch, seq, 256]

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "te/nn/dense.h"
#include "te/nn/functional.h"
#include "te/nn/moe.h"
#include "te/nn/sharded.h"

namespace te::nn {

/// Options for LayerNormMoE(hidden, ffn_hidden per expert, experts).
struct LayerNormMoEOptions {
  LayerNormMoEOptions(int64_t hidden_size, int64_t ffn_hidden_size, int64_t num_experts)
      : hidden_size_(hidden_size),
        ffn_hidden_size_(ffn_hidden_size),
        num_experts_(num_experts),
        layernorm_(hidden_size) {}
  TORCH_ARG(int64_t, hidden_size);
  /// Each expert's intermediate size (transformers' moe_intermediate_size).
  TORCH_ARG(int64_t, ffn_hidden_size);
  TORCH_ARG(int64_t, num_experts);
  /// The norm in front (its hidden_size must equal hidden_size).
  TORCH_ARG(LayerNormOptions, layernorm);
  /// How tokens choose experts (te/nn/moe.h): topk, the score function, pre-softmax, groups,
  /// the scaling factor.
  TORCH_ARG(functional::RouterOptions, router) = {};
  /// A learned bias on the router's logits (gpt-oss's router Linear), not a selection-only
  /// expert_bias.
  TORCH_ARG(bool, router_bias) = false;
  /// Each expert's activations, as LayerNormMLP's: {"silu", "linear"} is SwiGLU.
  TORCH_ARG(std::vector<std::string>, activations) = {"silu", "linear"};
  TORCH_ARG(functional::ActivationParams, activation_params) = {};
  /// Dropout on the experts' activations (training only).
  TORCH_ARG(double, intermediate_dropout_rate) = 0.0;
  /// Biases on each expert's two projections.
  TORCH_ARG(bool, use_bias) = false;
  /// A shared expert every token goes through too (Qwen2-MoE, DeepSeek): its intermediate size,
  /// 0 for none; with shared_expert_gate its output is scaled by sigmoid(x · gate) (Qwen2-MoE's
  /// shared_expert_gate, a [hidden, 1] kernel).
  TORCH_ARG(int64_t, shared_expert_size) = 0;
  TORCH_ARG(bool, shared_expert_gate) = false;
  /// The load-balancing loss's coefficient (functional::moe_aux_loss over this block's tokens)
  /// and the z-loss's (functional::moe_z_loss); 0: not computed. forward_with_aux_loss returns
  /// their sum.
  TORCH_ARG(double, aux_loss_coeff) = 0.0;
  TORCH_ARG(double, z_loss_coeff) = 0.0;
  /// Logical axes: the router's kernel (hidden, experts), the experts' first kernel (experts,
  /// hidden, activations, mlp) and second (experts, mlp, hidden), their biases, and the shared
  /// expert's kernels as LayerNormMLP's. The expert dim's axis "exp" is TE's table's entry for
  /// MeshResource::ep: sharded, each rank holds its experts and the tokens travel to them by
  /// all-to-all (expert parallelism).
  TORCH_ARG(LogicalAxes, gate_kernel_axes) = {axis::kWFsdp, axis::kWNoShard};
  TORCH_ARG(LogicalAxes, wi_kernel_axes) = {axis::kExp, axis::kWFsdp, axis::kWJoined, axis::kWTp};
  TORCH_ARG(LogicalAxes, wo_kernel_axes) = {axis::kExp, axis::kWTp, axis::kWFsdp};
  TORCH_ARG(LogicalAxes, wi_bias_axes) = {axis::kExp, axis::kWJoined, axis::kWTp};
  TORCH_ARG(LogicalAxes, wo_bias_axes) = {axis::kExp, axis::kWNoShard};
  TORCH_ARG(LogicalAxes, shared_kernel_axes_1) = axis::joined_in_kernel();
  TORCH_ARG(LogicalAxes, shared_kernel_axes_2) = axis::out_kernel();
  /// Constraints on the norm's input, the experts' input (the tokens, whole over the hidden
  /// dim: batch and sequence may stay split), and the output; empty: none.
  TORCH_ARG(LogicalAxes, layernorm_input_axes) = {};
  TORCH_ARG(LogicalAxes, dot_1_input_axes) = {};
  TORCH_ARG(LogicalAxes, output_axes) = {};
};

/// norm, then each token through its router's top-k experts, their outputs summed weighted by
/// the routing probabilities (functional::moe_permute_with_probs, grouped GEMMs, moe_unpermute),
/// plus the shared expert's. On a mesh (forward(DTensor)) the tokens stay split as they come
/// (data parallel, FSDP), the experts' mlp dim may be split (tensor parallel within experts)
/// and the experts themselves (the "exp" axis: expert parallel): a rank's tokens are sent to the
/// ranks holding their experts and back by all-to-all, counts exchanged first (ragged), when the
/// tokens are split over the same mesh axis; replicated tokens are routed by every rank alike
/// and each rank's experts contribute a partial sum. Parameters: gate_kernel [hidden, experts]
/// (gate_bias [experts]), wi_kernel [experts, hidden, slots, ffn], wo_kernel [experts, ffn,
/// hidden] (wi_bias [experts, slots, ffn], wo_bias [experts, hidden]), shared_wi_kernel
/// [hidden, slots, shared], shared_wo_kernel [shared, hidden], shared_gate_kernel [hidden, 1].
/// Under an FP8 recipe each expert's two GEMMs have their own scaling (buffers wi_<e>_fp8_*,
/// wo_<e>_fp8_*), as do the shared expert's; the router and the shared expert's gate stay in
/// high precision (Megatron's router is a plain Linear: a quantized logit would move tokens
/// between experts).
class LayerNormMoEImpl : public torch::nn::Cloneable<LayerNormMoEImpl>, public ShardedModule {
 public:
  LayerNormMoEImpl(int64_t hidden_size, int64_t ffn_hidden_size, int64_t num_experts)
      : LayerNormMoEImpl(LayerNormMoEOptions(hidden_size, ffn_hidden_size, num_experts)) {}
  explicit LayerNormMoEImpl(const LayerNormMoEOptions& options);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// input [..., hidden] -> [..., hidden].
  at::Tensor forward(const at::Tensor& input);
  DTensor forward(const DTensor& input);
  /// The output and the norm's output (LayerNormMLP's forward_with_layernorm_output).
  std::pair<at::Tensor, at::Tensor> forward_with_layernorm_output(const at::Tensor& input);
  std::pair<DTensor, DTensor> forward_with_layernorm_output(const DTensor& input);
  /// The output and the block's auxiliary loss (aux_loss_coeff's and z_loss_coeff's terms over
  /// its tokens; a zero scalar when both are 0). On a mesh the loss is the whole batch's: each
  /// rank's share of it, Partial over the axes that split the tokens.
  std::pair<at::Tensor, at::Tensor> forward_with_aux_loss(const at::Tensor& input);
  std::pair<DTensor, DTensor> forward_with_aux_loss(const DTensor& input);

  LayerNormMoEOptions options;
  LayerNorm layernorm{nullptr};
  at::Tensor gate_kernel, gate_bias, wi_kernel, wi_bias, wo_kernel, wo_bias;
  at::Tensor shared_wi_kernel, shared_wo_kernel, shared_gate_kernel;
  std::shared_ptr<fp8::GemmMeta> shared_wi_fp8, shared_wo_fp8;
  /// Each expert's FP8 state, all experts' on every rank. On a mesh each expert's amaxes reduce
  /// over the ranks that hold it (every mesh dim but the expert-parallel one), each of which runs
  /// every local expert's GEMMs, one of no rows included: the scales are one process's.
  std::vector<std::shared_ptr<fp8::GemmMeta>> wi_fp8, wo_fp8;

 protected:
  /// The experts' and the shared expert's kernels can be held in GGUF blocks (one process).
  void forget_member(const std::string& name) override;
};
TE_MODULE(LayerNormMoE);

/// What one LayerNormMoE forward's router did over the whole batch, for a load-balancing loss
/// taken over several layers at once (load_balancing_loss): per expert, the tokens whose top-k
/// chose it (no gradient) and the sum over the tokens of its score
/// (functional::compute_score_for_moe_aux_loss's: the softmax over every expert for a softmax
/// router), and the token count; float32 (float64 logits: float64). On a mesh each is the whole
/// batch's on every rank (summed over the axes that split the tokens), and the score sums'
/// gradient reaches each rank's own tokens.
struct RouterLoad {
  at::Tensor selected;    ///< [experts]
  at::Tensor score_sums;  ///< [experts]
  at::Tensor tokens;      ///< []
};

/// While open on this thread, every LayerNormMoE forward (on one process or a mesh) appends its
/// RouterLoad to the innermost RouterLoadScope, in call order: a model's layers in order.
///
/// Example (transformers' training loss of a MoE model with output_router_logits):
///   te::nn::RouterLoadScope loads;
///   at::Tensor logits = model->forward(ids);
///   at::Tensor loss = cross_entropy(...) + coeff * te::nn::load_balancing_loss(loads.loads());
class RouterLoadScope {
 public:
  RouterLoadScope();
  ~RouterLoadScope();
  RouterLoadScope(const RouterLoadScope&) = delete;
  RouterLoadScope& operator=(const RouterLoadScope&) = delete;

  const std::vector<RouterLoad>& loads() const { return loads_; }
  /// Appends `load` (LayerNormMoE's forward calls this on the innermost open scope).
  void record(RouterLoad load) { loads_.push_back(std::move(load)); }
  /// The innermost scope open on this thread, or null.
  static RouterLoadScope* current();

 private:
  std::vector<RouterLoad> loads_;
};

/// transformers' load_balancing_loss_func (models/qwen3_moe/modeling_qwen3_moe.py in 5.23.0, as
/// Mixtral's, Qwen2-MoE's and OLMoE's) over the layers' loads taken as one batch, every layer's
/// tokens counted once per layer:
///   experts · Σ_e (Σ_l selected[l][e] / Σ_l tokens[l]) · (Σ_l score_sums[l][e] / Σ_l tokens[l])
/// A scalar; te::Error for no load, or loads of different expert counts.
at::Tensor load_balancing_loss(const std::vector<RouterLoad>& loads);

}  // namespace te::nn
