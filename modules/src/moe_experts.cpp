// LayerNormMoE's experts (modules/src/moe_experts.h): the routed experts on this rank's tokens,
// sent to the ranks holding their experts by a ragged all-to-all under expert parallelism, and
// the auxiliary loss; on meta tensors (te::nn::plan) as a balanced router would route.

#include "moe_experts.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "forward.h"
#include "te/distributed/ops.h"
#include "te/distributed/scopes.h"
#include "te/error.h"
#include "te/fp8.h"
#include "te/nn/block_weights.h"
#include "te/nn/grouped_linear.h"
#include "te/nn/init.h"
#include "te/nn/random.h"

namespace te::nn::detail {

namespace F = functional;
using Placements = std::vector<Placement>;

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// One ragged exchange of rows along a mesh dim, and its reverse for the gradient.
struct RowsExchange : torch::CustomClassHolder {
  std::optional<DeviceMesh> mesh;
  int64_t dim = 0;
  std::vector<int64_t> send, recv;
};

struct AllToAllRows : torch::autograd::Function<AllToAllRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows,
                            c10::intrusive_ptr<RowsExchange> x) {
    ctx->saved_data["exchange"] = c10::IValue::make_capsule(x);
    ctx->saved_data["scopes"] = ScopeCapture::current().to_ivalue();
    return x->mesh->all_to_all_rows(rows, x->dim, x->send, x->recv);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto x =
        c10::static_intrusive_pointer_cast<RowsExchange>(ctx->saved_data["exchange"].toCapsule());
    const ScopeLoan loan(ScopeCapture::from_ivalue(ctx->saved_data["scopes"]));
    return {x->mesh->all_to_all_rows(grads[0].contiguous(), x->dim, x->recv, x->send),
            at::Tensor()};
  }
};

at::Tensor exchange_rows(const at::Tensor& rows, const DeviceMesh& mesh, int64_t dim,
                         std::vector<int64_t> send, std::vector<int64_t> recv) {
  auto x = c10::make_intrusive<RowsExchange>();
  x->mesh = mesh;
  x->dim = dim;
  x->send = std::move(send);
  x->recv = std::move(recv);
  return AllToAllRows::apply(rows, x);
}

// How this rank's share of the experts runs: its pieces of their parameters, the mesh dims that
// split the tokens, the experts (expert parallelism) and the experts' mlp dim (tensor
// parallelism within each expert).
struct ExpertsHere {
  at::Tensor wi, wi_bias, wo, wo_bias;  // this rank's pieces
  const DeviceMesh* mesh = nullptr;     // null: one process
  std::vector<int64_t> token_dims;      // mesh dims that split the tokens
  std::optional<int64_t> ep_dim;        // the mesh dim that splits the experts
  bool exchange = false;                // the tokens are split over ep_dim too: all-to-all
  int64_t ep_size = 1, ep_rank = 0;
  bool add_bias = true;  // this rank adds wo_bias (one rank of the tp dims)
  // The logits the losses read (whole gradients), when not those that route (partial ones).
  at::Tensor loss_logits;
  // With dropout: each local token's index among all tokens (int64), their count, and where
  // this rank's columns of the experts' ffn dim start (tensor parallelism), so that a row's mask
  // is one process's wherever the row runs (undefined without dropout).
  at::Tensor token_ids;
  int64_t all_tokens = 0, ffn_offset = 0;
  // The mesh dims the experts' FP8 amaxes reduce over: all but the expert-parallel one, whose
  // ranks run other experts.
  std::vector<int64_t> amax_dims;
};

// Whether the experts' dropout draws in this forward.
bool drops(const LayerNormMoEImpl& self) {
  return self.is_training() && self.options.intermediate_dropout_rate() > 0;
}

// Each permuted row's index in the [all tokens · experts, ffn] tensor the experts' dropout draws
// from, (global token) · experts + expert, for rows of experts first, first + 1, ... grouped as
// `perm` holds them; undefined without dropout.
at::Tensor row_ids(const LayerNormMoEImpl& self, const ExpertsHere& here,
                   const F::Permutation& perm, int64_t first) {
  if (!here.token_ids.defined()) return at::Tensor();
  const auto ids = at::TensorOptions().dtype(at::kLong);
  if (perm.tokens.is_meta()) return at::empty({perm.tokens.size(0)}, ids.device(at::kMeta));
  const auto n = static_cast<int64_t>(perm.rows_per_expert.size());
  const at::Tensor expert = at::repeat_interleave(at::arange(first, first + n, ids),
                                                  at::tensor(perm.rows_per_expert, ids));
  return here.token_ids.index_select(0, perm.source.cpu()) * self.options.num_experts() + expert;
}

// The experts [first, first + m_splits.size()) on rows grouped by expert (m_splits each), `ids`
// the rows' row_ids: this rank's pieces (tensor parallelism splits f), or held in GGUF blocks.
at::Tensor expert_mlp(LayerNormMoEImpl& self, const ExpertsHere& here, const at::Tensor& rows,
                      const std::vector<int64_t>& m_splits, int64_t first, const at::Tensor& ids) {
  const LayerNormMoEOptions& o = self.options;
  const ShardedModule::HeldBlocks* held_wi = self.held_blocks("wi_kernel");
  const ShardedModule::HeldBlocks* held_wo = self.held_blocks("wo_kernel");
  TE_CHECK((held_wi == nullptr && held_wo == nullptr) || (here.mesh == nullptr && !ids.defined()),
           "LayerNormMoE: the experts' kernels are held in GGUF blocks, which serve one process "
           "in inference (no mesh, no dropout); load them dequantized to train or shard");
  const auto n = static_cast<int64_t>(m_splits.size());
  const int64_t h = o.hidden_size(), f = here.wi.defined() ? here.wi.size(3) : o.ffn_hidden_size();
  const auto a = static_cast<int64_t>(F::activation_slots(o.activations()).size());
  const auto metas = [&](const std::vector<std::shared_ptr<fp8::GemmMeta>>& all) {
    return std::vector<std::shared_ptr<fp8::GemmMeta>>(all.begin() + first,
                                                       all.begin() + first + n);
  };
  const std::vector<int64_t>* amax_dims = here.mesh != nullptr ? &here.amax_dims : nullptr;
  const at::Tensor wi_bias =
      here.wi_bias.defined() ? here.wi_bias.reshape({-1, a * f}) : at::Tensor();
  const at::Tensor hid =
      held_wi != nullptr ? grouped_block_linear(rows, *held_wi->matrix, o.num_experts(), m_splits,
                                                first, wi_bias, "the kernel 'wi_kernel'")
                         : F::grouped_dense(rows, here.wi.reshape({n, h, a * f}), m_splits, wi_bias,
                                            metas(self.wi_fp8), here.mesh, amax_dims);
  at::Tensor act =
      F::mlp_activation(hid.view({rows.size(0), a, f}), o.activations(), o.activation_params());
  if (ids.defined()) {
    act = F::dropout_rows(act, o.intermediate_dropout_rate(), true,
                          {here.all_tokens * o.num_experts(), o.ffn_hidden_size()}, ids,
                          here.ffn_offset);
  }
  // Under tensor parallelism one rank adds the bias to the partial sums; the others add zeros
  // of it, so that every rank's gradient of it takes part in the reduction.
  at::Tensor bias = here.wo_bias;
  if (bias.defined() && !here.add_bias) bias = bias * 0;
  if (held_wo != nullptr) {
    return grouped_block_linear(act, *held_wo->matrix, o.num_experts(), m_splits, first, bias,
                                "the kernel 'wo_kernel'");
  }
  return F::grouped_dense(act, here.wo, m_splits, bias, metas(self.wo_fp8), here.mesh, amax_dims);
}

// Sums of `counts` [experts] in blocks of `per` experts: the rows each rank gets.
std::vector<int64_t> block_sums(const std::vector<int64_t>& counts, int64_t per) {
  std::vector<int64_t> out(counts.size() / static_cast<std::size_t>(per), 0);
  for (std::size_t i = 0; i < counts.size(); ++i)
    out[i / static_cast<std::size_t>(per)] += counts[i];
  return out;
}

// te::nn::plan runs on meta tensors, which hold no values to route by: there each expert takes an
// equal share of the routed rows (tokens x topk over all experts, the first ones one more), so
// the plan counts the buffers and all-to-all bytes of a balanced router. The rows of `count`
// experts from expert `first` on, in place of moe_permute's.
F::Permutation planned_permutation(const at::Tensor& tokens, int64_t topk, int64_t experts,
                                   int64_t first, int64_t count) {
  const int64_t routed = tokens.size(0) * topk;
  F::Permutation p;
  int64_t rows = 0;
  for (int64_t e = first; e < first + count; ++e) {
    p.rows_per_expert.push_back(routed / experts + (e < routed % experts ? 1 : 0));
    rows += p.rows_per_expert.back();
  }
  p.tokens = tokens.repeat({topk, 1}).narrow(0, 0, rows);
  p.num_tokens = tokens.size(0);
  p.slots_per_token = count;
  return p;
}

// moe_unpermute's shape and dependencies, for planning: [tokens, hidden] from the rows and the
// routing weights.
at::Tensor planned_unpermute(const at::Tensor& rows, const F::Permutation& p,
                             const at::Tensor& probs) {
  return rows.new_zeros({p.num_tokens, rows.size(1)}) + rows.sum(0) * probs.sum();
}

// Expert parallelism over the mesh dim that splits the tokens too (Megatron's
// MoEAlltoAllTokenDispatcher): rows grouped by expert go to the experts' ranks, counts first;
// there they are grouped by local expert, run, and sent back.
at::Tensor exchanged_experts(LayerNormMoEImpl& self, const ExpertsHere& here,
                             const F::Permutation& perm, const at::Tensor& perm_ids) {
  const int64_t experts = self.options.num_experts(), ep = here.ep_size;
  const int64_t per = experts / ep, first = here.ep_rank * per;
  const DeviceMesh& mesh = *here.mesh;
  const std::vector<int64_t>& counts = perm.rows_per_expert;
  const std::vector<int64_t> send = block_sums(counts, per);
  const bool planning = perm.tokens.is_meta();
  const at::Tensor sent_counts = at::tensor(counts, at::kLong).view({experts, 1});
  const at::Tensor got =
      mesh.all_to_all_rows(sent_counts.to(perm.tokens.device()), *here.ep_dim,
                           std::vector<int64_t>(ep, per), std::vector<int64_t>(ep, per));
  // from[s * per + e]: the rows source rank s sends this rank's local expert e (planning: every
  // rank's balanced counts alike).
  std::vector<int64_t> from;
  if (planning) {
    for (int64_t s = 0; s < ep; ++s) {
      from.insert(from.end(), counts.begin() + first, counts.begin() + first + per);
    }
  } else {
    const at::Tensor c = got.cpu().contiguous();
    from.assign(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + ep * per);
  }
  const std::vector<int64_t> recv = block_sums(from, per);
  const at::Tensor received = exchange_rows(perm.tokens, mesh, *here.ep_dim, send, recv);
  std::vector<int64_t> by_expert, m_splits(per, 0), sizes_by_expert, back_order;
  for (int64_t e = 0; e < per; ++e) {
    for (int64_t s = 0; s < ep; ++s) {
      by_expert.push_back(s * per + e);
      sizes_by_expert.push_back(from[s * per + e]);
      m_splits[e] += from[s * per + e];
    }
  }
  for (int64_t s = 0; s < ep; ++s) {
    for (int64_t e = 0; e < per; ++e) back_order.push_back(e * ep + s);
  }
  // (Planning: the sorts move no bytes between ranks and keep the shape.)
  const at::Tensor rows =
      planning ? received : F::moe_sort_chunks_by_index(received, from, by_expert);
  // The rows' dropout ids travel with them.
  at::Tensor ids;
  if (perm_ids.defined()) {
    ids = mesh.all_to_all_rows(perm_ids.view({-1, 1}).to(perm.tokens.device()), *here.ep_dim, send,
                               recv);
    ids = (planning ? ids : F::moe_sort_chunks_by_index(ids, from, by_expert)).view({-1});
  }
  const at::Tensor y = expert_mlp(self, here, rows, m_splits, first, ids);
  const at::Tensor back_local =
      planning ? y : F::moe_sort_chunks_by_index(y, sizes_by_expert, back_order);
  return exchange_rows(back_local, mesh, *here.ep_dim, recv, send);
}

// The block's auxiliary loss (zero scalar when off) and, with `record`, the router's load, for
// this rank's tokens (logits [T, experts], whole gradients): the router's scores once, then this
// rank's choices per expert and its token count summed over the ranks that split the tokens in
// one all-reduce; each rank's terms of its own tokens (partial sums there, as the load's score
// sums).
std::pair<at::Tensor, std::optional<RouterLoad>> router_losses(LayerNormMoEImpl& self,
                                                               const ExpertsHere& here,
                                                               const at::Tensor& logits,
                                                               bool record) {
  const LayerNormMoEOptions& o = self.options;
  at::Tensor aux = at::zeros({}, logits.options().dtype(at::kFloat));
  const bool switch_loss = o.aux_loss_coeff() > 0;
  if (!switch_loss && o.z_loss_coeff() <= 0 && !record) return {aux, std::nullopt};
  std::optional<F::Routing> scores;
  if (switch_loss || record) {
    scores = F::compute_score_for_moe_aux_loss(logits, o.router().topk, o.router().score_function);
  }
  // Counts in float64: exact well past any batch's tokens.
  const auto exact = logits.options().dtype(at::kDouble);
  at::Tensor counts = at::full({1}, static_cast<double>(logits.size(0)), exact);
  if (scores) counts = at::cat({scores->routing_map.sum(0).to(at::kDouble), counts});
  const bool split = here.mesh != nullptr && !here.token_dims.empty();
  if (split) counts = here.mesh->all_reduce(counts, ReduceOp::kSum, here.token_dims);
  int64_t all_tokens = logits.size(0);
  if (counts.is_meta()) {  // planning: every rank's share as this rank's
    for (int64_t m : here.token_dims) all_tokens *= split ? here.mesh->size(m) : 1;
  } else {
    all_tokens = static_cast<int64_t>(counts[-1].item<double>());
  }
  const at::Tensor per_expert = scores ? counts.narrow(0, 0, counts.size(0) - 1) : at::Tensor();
  if (switch_loss) {
    aux = aux + F::moe_aux_loss(scores->probs, per_expert, all_tokens, o.router().topk,
                                o.aux_loss_coeff());
  }
  if (o.z_loss_coeff() > 0 && logits.size(0) > 0) {
    const double share = static_cast<double>(logits.size(0)) / static_cast<double>(all_tokens);
    aux = aux + F::moe_z_loss(logits, o.z_loss_coeff()) * share;
  }
  if (!record) return {aux, std::nullopt};
  RouterLoad load;
  load.score_sums = scores->probs.sum(0);
  load.selected = per_expert.to(load.score_sums.scalar_type());
  load.tokens = counts[-1].to(load.score_sums.scalar_type());
  return {aux, std::move(load)};
}

// What the routed experts give for this rank's tokens: the output, the auxiliary loss's share
// (zero scalar when off), and the router's load when a RouterLoadScope records it.
struct Routed {
  at::Tensor out, aux;
  std::optional<RouterLoad> load;
};

// The routed experts for this rank's tokens [T, hidden] and logits [T, experts].
Routed routed_experts(LayerNormMoEImpl& self, const ExpertsHere& here, const at::Tensor& tokens,
                      const at::Tensor& routing_logits) {
  const LayerNormMoEOptions& o = self.options;
  const F::Routing routing = F::topk_with_score_function(routing_logits, o.router());
  const bool planning = tokens.is_meta();  // te::nn::plan
  const auto permute = [&](int64_t first, int64_t count) {
    return planning ? planned_permutation(tokens, o.router().topk, o.num_experts(), first, count)
                    : F::moe_permute(tokens, routing.routing_map.narrow(1, first, count));
  };
  const auto unpermute = [&](const at::Tensor& rows, const F::Permutation& perm,
                             const at::Tensor& probs) {
    return planning ? planned_unpermute(rows, perm, probs) : F::moe_unpermute(rows, perm, probs);
  };
  at::Tensor out;
  if (here.ep_dim && !here.exchange) {
    // Every rank routes the same tokens; each runs its own experts: partial sums.
    const int64_t per = o.num_experts() / here.ep_size, first = here.ep_rank * per;
    const F::Permutation perm = permute(first, per);
    out = unpermute(expert_mlp(self, here, perm.tokens, perm.rows_per_expert, first,
                               row_ids(self, here, perm, first)),
                    perm, routing.probs.narrow(1, first, per));
  } else {
    const F::Permutation perm = permute(0, o.num_experts());
    const at::Tensor ids = row_ids(self, here, perm, 0);
    const at::Tensor rows = here.ep_dim
                                ? exchanged_experts(self, here, perm, ids)
                                : expert_mlp(self, here, perm.tokens, perm.rows_per_expert, 0, ids);
    out = unpermute(rows, perm, routing.probs);
  }
  const at::Tensor logits = here.loss_logits.defined()
                                ? here.loss_logits.reshape({-1, routing_logits.size(-1)})
                                : routing_logits;
  auto [aux, load] =
      router_losses(self, here, logits, RouterLoadScope::current() != nullptr && !planning);
  return {out, aux, std::move(load)};
}

}  // namespace

// The routed experts on one process.
std::pair<at::Tensor, at::Tensor> moe_experts(LayerNormMoEImpl& self, const at::Tensor& x,
                                              const at::Tensor& logits) {
  ExpertsHere here;
  here.wi = self.wi_kernel;
  here.wi_bias = self.wi_bias;
  here.wo = self.wo_kernel;
  here.wo_bias = self.wo_bias;
  const int64_t hidden = x.size(-1);
  if (drops(self)) {
    here.all_tokens = x.numel() / hidden;
    here.token_ids = at::arange(here.all_tokens, at::kLong);
  }
  Routed r =
      routed_experts(self, here, x.reshape({-1, hidden}), logits.reshape({-1, logits.size(-1)}));
  if (r.load) RouterLoadScope::current()->record(std::move(*r.load));
  return {r.out.view(x.sizes()), r.aux};
}

namespace {

// How the experts' parameters and the tokens meet on each mesh dim: which dims split each
// expert's mlp dim (tp), the experts (ep) and the tokens (split).
struct MeshPlan {
  std::vector<bool> tp, ep, split;
};

MeshPlan plan_experts(LayerNormMoEImpl& self, const DTensor& x_in, ExpertsHere& here) {
  const DeviceMesh& mesh = x_in.mesh();
  const auto n = static_cast<std::size_t>(mesh.ndim());
  const DTensor wi = self.as_dtensor("wi_kernel", self.wi_kernel, mesh);
  const DTensor wo = self.as_dtensor("wo_kernel", self.wo_kernel, mesh);
  MeshPlan plan{std::vector<bool>(n), std::vector<bool>(n), std::vector<bool>(n)};
  // Where this rank's columns of the mlp dim start (the dropout's place for them).
  here.ffn_offset = local_chunks(wi.sizes(), mesh, wi.placements(), mesh.rank())[3].offset;
  for (std::size_t m = 0; m < n; ++m) {
    const Placement& pi = wi.placements()[m];
    const Placement& po = wo.placements()[m];
    plan.tp[m] = is_shard(pi) && std::get<Shard>(pi).dim == 3;
    plan.ep[m] = is_shard(pi) && std::get<Shard>(pi).dim == 0;
    const bool tp_o = is_shard(po) && std::get<Shard>(po).dim == 1;
    const bool ep_o = is_shard(po) && std::get<Shard>(po).dim == 0;
    TE_CHECK(plan.tp[m] == tp_o && plan.ep[m] == ep_o, "LayerNormMoE: wi_kernel ", wi.to_string(),
             " and wo_kernel ", wo.to_string(), " split mesh axis '", mesh.axis_names()[m],
             "' differently; give the experts' mlp axis (and exp) the same mesh axes in both "
             "(wi_kernel_axes, wo_kernel_axes)");
    // The biases split as their kernels: experts on the ep dim, the mlp dim on the tp dim.
    for (const auto& [name, bias, mlp_dim] :
         {std::tuple<const char*, at::Tensor, int64_t>{"wi_bias", self.wi_bias, 2},
          {"wo_bias", self.wo_bias, -1}}) {
      if (!bias.defined()) continue;
      const Placement pb = self.as_dtensor(name, bias, mesh).placements()[m];
      const bool ep_b = is_shard(pb) && std::get<Shard>(pb).dim == 0;
      const bool tp_b = is_shard(pb) && std::get<Shard>(pb).dim == mlp_dim;
      TE_CHECK(ep_b == plan.ep[m] && (mlp_dim < 0 || tp_b == plan.tp[m]) &&
                   (ep_b || tp_b || !is_shard(pb)),
               "LayerNormMoE: ", name, " splits mesh axis '", mesh.axis_names()[m],
               "' otherwise than the kernels (", wi.to_string(), "); give ", name,
               "'s axes (wi_bias_axes, wo_bias_axes) the kernels' exp and mlp axes");
    }
    // The tokens, whole over the hidden dim and where the experts' mlp dim is split.
    const Placement& px = x_in.placements()[m];
    plan.split[m] = is_shard(px) && std::get<Shard>(px).dim < x_in.dim() - 1 && !plan.tp[m];
    if (plan.split[m]) here.token_dims.push_back(static_cast<int64_t>(m));
    if (plan.ep[m]) {
      TE_CHECK(!here.ep_dim, "LayerNormMoE: the experts (", wi.to_string(),
               ") are split over two mesh axes; give the logical axis 'exp' one mesh axis");
      here.ep_dim = static_cast<int64_t>(m);
      here.ep_size = mesh.size(static_cast<int64_t>(m));
      here.ep_rank = mesh.coordinate(static_cast<int64_t>(m));
      here.exchange = plan.split[m];
      TE_CHECK(self.options.num_experts() % here.ep_size == 0,
               "LayerNormMoE: ", self.options.num_experts(),
               " experts do not split evenly over mesh axis '", mesh.axis_names()[m], "' of ",
               here.ep_size,
               " ranks; give the 'exp' axis a mesh axis whose size divides num_experts");
    }
    if (plan.tp[m]) here.add_bias = here.add_bias && mesh.coordinate(static_cast<int64_t>(m)) == 0;
  }
  return plan;
}

}  // namespace

// The routed experts on a mesh: each parameter's piece by how its placements and the tokens'
// meet on each mesh dim.
std::pair<DTensor, DTensor> moe_experts(LayerNormMoEImpl& self, const DTensor& x_in,
                                        const DTensor& logits_in) {
  const DeviceMesh& mesh = x_in.mesh();
  const auto n = static_cast<std::size_t>(mesh.ndim());
  ExpertsHere here;
  here.mesh = &mesh;
  const auto [tp, ep, split] = plan_experts(self, x_in, here);
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    if (!here.ep_dim || m != *here.ep_dim) here.amax_dims.push_back(m);
  }
  const int64_t last = x_in.dim() - 1;
  const DTensor x = replicated_where(
      x_in, [&](const Placement& p, std::size_t m) { return !split[m] || !is_shard(p); });
  const DTensor logits = replicated_where(logits_in, [&](const Placement& p, std::size_t m) {
    return !(split[m] && is_shard(p) && std::get<Shard>(p).dim < last && x.placements()[m] == p);
  });
  // Each parameter's piece: kept where its experts or mlp dim are split (ep, tp); gathered
  // elsewhere (FSDP's split, or whole), its gradient a partial sum where the tokens are split.
  const auto piece = [&](const char* name, const at::Tensor& local,
                         std::optional<int64_t> mlp_dim) {
    if (!local.defined()) return at::Tensor();
    const DTensor p = self.as_dtensor(name, local, mesh);
    Placements use(n), grads(n);
    for (std::size_t m = 0; m < n; ++m) {
      const Placement& pp = p.placements()[m];
      const bool keep = (ep[m] || (tp[m] && mlp_dim)) && is_shard(pp) &&
                        (std::get<Shard>(pp).dim == 0 || std::get<Shard>(pp).dim == mlp_dim);
      if (keep) {
        use[m] = grads[m] = pp;
      } else {
        use[m] = Replicate{};
        grads[m] = split[m] || (tp[m] && !mlp_dim) ? Placement(Partial{}) : Placement(Replicate{});
      }
    }
    return p.redistribute(use, grads).to_local();
  };
  here.wi = piece("wi_kernel", self.wi_kernel, 3);
  here.wo = piece("wo_kernel", self.wo_kernel, 1);
  here.wi_bias = piece("wi_bias", self.wi_bias, 2);
  here.wo_bias = piece("wo_bias", self.wo_bias, std::nullopt);
  if (drops(self)) {
    // Each local token's index among the batch's: its place in the global [..., hidden] tensor.
    const std::vector<int64_t> lead(x.sizes().begin(), x.sizes().end() - 1);
    here.all_tokens = std::accumulate(lead.begin(), lead.end(), int64_t{1}, std::multiplies<>());
    at::Tensor ids = at::arange(here.all_tokens, at::kLong).view(lead);
    const auto chunks = local_chunks(x.sizes(), mesh, x.placements(), mesh.rank());
    for (std::size_t d = 0; d < lead.size(); ++d) {
      ids = ids.narrow(static_cast<int64_t>(d), chunks[d].offset, chunks[d].length);
    }
    here.token_ids = ids.reshape({-1});
  }
  // Where each rank's output is a partial sum (tp, ep on whole tokens), so is the gradient each
  // gets for its tokens and for the routing weights: summed over those mesh dims in backward.
  // The losses read the logits whole on every rank, with whole gradients.
  Placements placed(n), aux_placed(n), x_grads = x.placements(), l_grads = logits.placements();
  for (std::size_t m = 0; m < n; ++m) {
    const bool partial = tp[m] || (ep[m] && !split[m]);
    placed[m] = partial ? Placement(Partial{}) : x.placements()[m];
    aux_placed[m] = split[m] ? Placement(Partial{}) : Placement(Replicate{});
    if (partial) x_grads[m] = l_grads[m] = Partial{};
  }
  const at::Tensor x_local = x.redistribute(x.placements(), x_grads).to_local();
  const at::Tensor l_local = logits.redistribute(logits.placements(), l_grads).to_local();
  here.loss_logits = logits.to_local();
  Routed r = routed_experts(self, here, x_local.reshape({-1, x_local.size(-1)}),
                            l_local.reshape({-1, l_local.size(-1)}));
  if (r.load) {
    // The whole batch's score sums on every rank, each rank's gradient its own tokens'.
    RouterLoad& load = *r.load;
    load.score_sums =
        DTensor::from_local(load.score_sums, mesh, aux_placed, load.score_sums.sizes().vec())
            .full_tensor();
    RouterLoadScope::current()->record(std::move(load));
  }
  return {DTensor::from_local(r.out.view(x_local.sizes()), mesh, placed, x.sizes()),
          DTensor::from_local(r.aux, mesh, aux_placed, std::vector<int64_t>{})};
}

}  // namespace te::nn::detail
