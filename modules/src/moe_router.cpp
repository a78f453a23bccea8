// The MoE router and its losses (te/nn/moe.h): TE's fused_topk_with_score_function,
// fused_compute_score_for_moe_aux_loss and fused_moe_aux_loss (router.py at d0067d0da; the math
// of their references in tests/pytorch/test_fused_router.py), Megatron-LM's z-loss, sequence
// aux loss and capacity (moe_utils.py, router.py at d98e8a64). Written as LibTorch operations,
// so autograd gives the gradient TE's kernels compute.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "forward.h"
#include "te/error.h"
#include "te/nn/moe.h"

namespace te::nn::functional {

namespace {

using te::nn::detail::dtype_and_shape;
using te::nn::detail::shape_of;

at::ScalarType compute_type(const at::Tensor& logits) {
  return at::promote_types(logits.scalar_type(), at::kFloat);
}

void check_topk(int64_t topk, int64_t experts, const char* who) {
  TE_CHECK(topk >= 1 && topk <= experts, who, ": topk ", topk, " is not in [1, ", experts,
           "] (the experts)");
}

// Scores divided by their sum over the experts (+1e-20, TE's and Megatron's guard).
at::Tensor normalised(const at::Tensor& scores) {
  return scores / (scores.sum(-1, /*keepdim=*/true) + 1e-20);
}

// The switch loss's sum: Σ_e (Σ_t probs[t, e]) · counts[e] · experts · coeff / (topk · T²) for
// probs [T, columns] (columns: experts, or sequences x experts) and counts [columns].
at::Tensor switch_loss(const at::Tensor& probs, const at::Tensor& counts, int64_t experts,
                       int64_t total_tokens, int64_t topk, double coeff) {
  const double scale = static_cast<double>(experts) * coeff /
                       (static_cast<double>(topk) * static_cast<double>(total_tokens) *
                        static_cast<double>(total_tokens));
  const at::ScalarType type = compute_type(probs);
  return (probs.to(type).sum(0) * counts.detach().to(probs.device(), type)).sum() * scale;
}

// logits [..., experts] -> [tokens, experts] in the compute type, after the checks every
// router entry point shares.
at::Tensor router_rows(const at::Tensor& logits, int64_t topk, const char* who) {
  TE_CHECK(logits.defined() && logits.dim() >= 1 && at::isFloatingType(logits.scalar_type()), who,
           ": logits are ", dtype_and_shape(logits), "; give floating-point logits [..., experts]");
  const int64_t experts = logits.size(-1);
  TE_CHECK(experts > 0, who, ": logits ", logits.sizes(), " have no experts");
  check_topk(topk, experts, who);
  return logits.reshape({-1, experts}).to(compute_type(logits));
}

void check_groups(const RouterOptions& o, int64_t experts) {
  if (o.num_groups == 0 && o.group_topk == 0) return;
  TE_CHECK(o.num_groups > 0 && o.group_topk > 0, "topk_with_score_function: num_groups ",
           o.num_groups, " and group_topk ", o.group_topk,
           " must both be set (> 0) for group-limited top-k, or both 0");
  TE_CHECK(experts % o.num_groups == 0, "topk_with_score_function: ", experts,
           " experts do not split into num_groups ", o.num_groups, " equal groups");
  TE_CHECK(o.group_topk <= o.num_groups, "topk_with_score_function: group_topk ", o.group_topk,
           " is more than num_groups ", o.num_groups);
  TE_CHECK(o.topk % o.group_topk == 0, "topk_with_score_function: topk ", o.topk,
           " is not a multiple of group_topk ", o.group_topk,
           " (each chosen group gives topk / group_topk experts)");
  TE_CHECK(o.topk / o.group_topk <= experts / o.num_groups, "topk_with_score_function: topk / ",
           "group_topk = ", o.topk / o.group_topk, " is more than a group's ",
           experts / o.num_groups, " experts");
}

// The top-k of scores [tokens, experts] (values, indices), group-limited when the options say.
std::tuple<at::Tensor, at::Tensor> top(const at::Tensor& scores, const RouterOptions& o) {
  if (o.group_topk == 0) return at::topk(scores, o.topk, -1);
  const int64_t tokens = scores.size(0), experts = scores.size(1);
  const int64_t per_group = experts / o.num_groups;
  const at::Tensor group_scores =
      std::get<0>(
          at::topk(scores.view({tokens, o.num_groups, per_group}), o.topk / o.group_topk, -1))
          .sum(-1);
  const at::Tensor groups =
      std::get<1>(at::topk(group_scores, o.group_topk, -1, /*largest=*/true, /*sorted=*/false));
  const at::Tensor kept = at::zeros_like(group_scores, at::kBool)
                              .scatter_(1, groups, true)
                              .unsqueeze(-1)
                              .expand({tokens, o.num_groups, per_group})
                              .reshape({tokens, experts});
  return at::topk(scores.masked_fill(kept.logical_not(), -std::numeric_limits<double>::infinity()),
                  o.topk, -1);
}

// sigmoid or sqrt(softplus) of x (the compute type).
at::Tensor bounded_scores(const at::Tensor& x, ScoreFunction f) {
  return f == ScoreFunction::kSigmoid ? at::sigmoid(x) : at::sqrt(at::softplus(x));
}

at::Tensor dense_map(const at::Tensor& rows, const at::Tensor& indices) {
  return at::zeros(rows.sizes(), rows.options().dtype(at::kBool)).scatter_(1, indices, true);
}

}  // namespace

Routing topk_with_score_function(const at::Tensor& logits, const RouterOptions& o,
                                 const at::Tensor& expert_bias) {
  const at::Tensor x = router_rows(logits, o.topk, "topk_with_score_function");
  const int64_t experts = x.size(1);
  check_groups(o, experts);
  TE_CHECK(std::isfinite(o.scaling_factor), "topk_with_score_function: scaling_factor ",
           o.scaling_factor, " is not finite");
  const ScoreFunction f = o.score_function;
  if (expert_bias.defined()) {
    TE_CHECK(f != ScoreFunction::kSoftmax,
             "topk_with_score_function: expert_bias is used with score_function sigmoid or "
             "sqrtsoftplus (TE's), not softmax; leave it undefined");
    TE_CHECK(expert_bias.dim() == 1 && expert_bias.size(0) == experts &&
                 at::isFloatingType(expert_bias.scalar_type()),
             "topk_with_score_function: expert_bias is ", expert_bias.scalar_type(), " ",
             expert_bias.sizes(), "; give floating-point [", experts, "] (one per expert)");
  }
  at::Tensor probs, indices;
  if (f == ScoreFunction::kSoftmax) {
    if (o.use_pre_softmax) {
      std::tie(probs, indices) = top(at::softmax(x, -1), o);
    } else {
      at::Tensor best;
      std::tie(best, indices) = top(x, o);
      probs = at::softmax(best, -1);
    }
  } else {
    const at::Tensor scores = bounded_scores(x, f);
    if (expert_bias.defined()) {
      // The bias steers the choice only: its gradient is none, the probabilities the scores'.
      indices = std::get<1>(
          top(scores.detach() + expert_bias.detach().to(x.device(), x.scalar_type()), o));
      probs = scores.gather(1, indices);
    } else {
      std::tie(probs, indices) = top(scores, o);
    }
    if (o.topk > 1) probs = normalised(probs);
  }
  if (o.scaling_factor != 0.0) probs = probs * o.scaling_factor;
  probs = probs.to(logits.scalar_type());
  const at::Tensor dense = at::zeros(x.sizes(), probs.options()).scatter(1, indices, probs);
  return {dense.view(logits.sizes()), dense_map(x, indices).view(logits.sizes())};
}

Routing compute_score_for_moe_aux_loss(const at::Tensor& logits, int64_t topk,
                                       TeChoice<ScoreFunction> score_function) {
  const at::Tensor x = router_rows(logits, topk, "compute_score_for_moe_aux_loss");
  at::Tensor scores;
  if (score_function == ScoreFunction::kSoftmax) {
    scores = at::softmax(x, -1);
  } else {
    scores = normalised(bounded_scores(x, score_function));
  }
  const at::Tensor indices = std::get<1>(at::topk(scores.detach(), topk, -1));
  return {scores.view(logits.sizes()), dense_map(x, indices).view(logits.sizes())};
}

at::Tensor moe_aux_loss(const at::Tensor& probs, const at::Tensor& tokens_per_expert,
                        int64_t total_tokens, int64_t topk, double coeff) {
  TE_CHECK(probs.defined() && probs.dim() == 2 && at::isFloatingType(probs.scalar_type()),
           "moe_aux_loss: probs are ", shape_of(probs), "; give floating-point [tokens, experts]");
  const int64_t experts = probs.size(1);
  TE_CHECK(tokens_per_expert.defined() && tokens_per_expert.dim() == 1 &&
               tokens_per_expert.size(0) == experts,
           "moe_aux_loss: tokens_per_expert is ", shape_of(tokens_per_expert), "; give [", experts,
           "] (one count per expert of probs ", probs.sizes(), ")");
  TE_CHECK(total_tokens > 0, "moe_aux_loss: total_tokens ", total_tokens, " must be positive");
  check_topk(topk, experts, "moe_aux_loss");
  return switch_loss(probs, tokens_per_expert, experts, total_tokens, topk, coeff);
}

at::Tensor moe_sequence_aux_loss(const at::Tensor& scores, const at::Tensor& routing_map,
                                 int64_t topk, double coeff) {
  TE_CHECK(scores.defined() && scores.dim() == 3 && routing_map.defined() &&
               routing_map.sizes() == scores.sizes(),
           "moe_sequence_aux_loss: scores ", shape_of(scores), " and routing_map ",
           shape_of(routing_map), " must both be [batch, seqlen, experts]");
  const int64_t batch = scores.size(0), seqlen = scores.size(1), experts = scores.size(2);
  TE_CHECK(batch > 0 && seqlen > 0, "moe_sequence_aux_loss: scores ", scores.sizes(),
           " hold no token");
  check_topk(topk, experts, "moe_sequence_aux_loss");
  // Each sequence's switch loss on its own counts: the sequences side by side as experts of one
  // [seqlen, batch * experts] problem (Megatron's reshape), then the mean over the batch.
  const at::Tensor counts = routing_map.to(at::kLong).sum(1).reshape({batch * experts});
  const at::Tensor wide = scores.transpose(0, 1).reshape({seqlen, batch * experts});
  return switch_loss(wide, counts, experts, seqlen, topk, coeff) / static_cast<double>(batch);
}

at::Tensor moe_z_loss(const at::Tensor& logits, double coeff, const at::Tensor& valid) {
  TE_CHECK(logits.defined() && logits.dim() >= 1 && at::isFloatingType(logits.scalar_type()),
           "moe_z_loss: logits are ", shape_of(logits),
           "; give floating-point logits [..., experts]");
  const at::Tensor z = at::logsumexp(logits.to(compute_type(logits)), -1).square();
  at::Tensor keep = at::ones_like(z);
  if (valid.defined()) {
    TE_CHECK(valid.sizes() == z.sizes(), "moe_z_loss: valid ", valid.sizes(),
             " is not the tokens' shape ", z.sizes(), " (logits ", logits.sizes(), ")");
    keep = valid.to(z.device(), at::kBool).to(z.scalar_type());
  }
  return (z * keep).sum() / keep.sum().clamp_min(1.0) * coeff;
}

int64_t moe_expert_capacity(int64_t tokens, int64_t topk, int64_t experts, double capacity_factor,
                            int64_t min_capacity) {
  TE_CHECK(tokens >= 0 && topk >= 1 && experts >= 1, "moe_expert_capacity: tokens ", tokens,
           ", topk ", topk, ", experts ", experts, " cannot make a capacity");
  TE_CHECK(std::isfinite(capacity_factor) && capacity_factor > 0,
           "moe_expert_capacity: capacity_factor ", capacity_factor, " must be positive");
  const auto capacity = static_cast<int64_t>(std::ceil(
      static_cast<double>(tokens * topk) / static_cast<double>(experts) * capacity_factor));
  return std::max(capacity, min_capacity);
}

Routing moe_drop_tokens(const Routing& routing, int64_t topk, double capacity_factor,
                        TeChoice<DropPolicy> policy, bool pad_to_capacity) {
  const at::Tensor& probs = routing.probs;
  const at::Tensor& map = routing.routing_map;
  TE_CHECK(probs.defined() && probs.dim() == 2 && map.defined() && map.sizes() == probs.sizes(),
           "moe_drop_tokens: probs and routing_map must both be [tokens, experts]");
  const int64_t tokens = probs.size(0);
  const int64_t capacity = moe_expert_capacity(tokens, topk, probs.size(1), capacity_factor);
  at::Tensor keep;
  if (capacity >= tokens) {
    keep = at::ones(probs.sizes(), map.options().dtype(at::kBool));
  } else if (policy == DropPolicy::kProbs) {
    const at::Tensor routed = probs.detach() * map.to(probs.scalar_type());
    const at::Tensor best =
        std::get<1>(at::topk(routed, capacity, 0, /*largest=*/true, /*sorted=*/false));
    keep = at::zeros(probs.sizes(), map.options().dtype(at::kBool)).scatter_(0, best, true);
  } else {
    // Each expert's routed tokens in token order, then (padding) the others in token order.
    const at::Tensor routed = map.to(at::kBool);
    const at::Tensor position = at::arange(tokens, map.options().dtype(at::kLong)).unsqueeze(1);
    const at::Tensor order = routed.to(at::kLong) * tokens + (tokens - 1 - position);
    const at::Tensor first = std::get<1>(at::topk(order, capacity, 0));
    keep = at::zeros(probs.sizes(), map.options().dtype(at::kBool)).scatter_(0, first, true);
  }
  const at::Tensor kept = pad_to_capacity ? keep : map.to(at::kBool) & keep;
  return {probs * kept.to(probs.scalar_type()), kept};
}

}  // namespace te::nn::functional
