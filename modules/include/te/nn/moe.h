#pragma once

// Mixture of experts on plain tensors: the router (which experts each token goes to, with what
// weight), its load-balancing losses, and the permutation that groups tokens by expert and
// undoes it. Transformer Engine's semantics (transformer_engine/pytorch/router.py and
// permutation.py at d0067d0da, whose tests/pytorch/test_fused_router.py and test_permutation.py
// give the reference math tests/interop/check_moe.py holds these to), with Megatron-LM's where
// TE has none (megatron/core/transformer/moe/moe_utils.py at d98e8a64: z-loss, capacity).
// Every function is differentiable where its result is a floating-point tensor.

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "te/nn/attention_types.h"  // TeChoice
#include "te/nn/moe_types.h"

namespace te::nn::functional {

/// The options of TE's fused_topk_with_score_function.
struct RouterOptions {
  /// Experts per token, in [1, experts].
  int64_t topk = 1;
  /// softmax: the softmax over every expert before the top-k (true), or over the top-k logits
  /// after it (false). Ignored by the other score functions.
  bool use_pre_softmax = false;
  /// Group-limited top-k (DeepSeek): the experts split into num_groups equal groups, a group
  /// scored by the sum of its best topk / group_topk scores, and the top-k taken within the
  /// best group_topk groups. Both 0 (off) or both set.
  int64_t num_groups = 0;
  int64_t group_topk = 0;
  /// Multiplies the probabilities (0: none).
  double scaling_factor = 0.0;
  TeChoice<ScoreFunction> score_function = ScoreFunction::kSoftmax;
};

/// Weights over the experts and the map of where tokens go, [..., experts] each.
struct Routing {
  /// Differentiable weights. From topk_with_score_function: each token's weight for the experts
  /// it goes to (zero elsewhere), in the logits' dtype; from compute_score_for_moe_aux_loss: the
  /// scores over every expert, float32.
  at::Tensor probs;
  /// bool: true where the token goes to the expert (topk per token, until moe_drop_tokens).
  at::Tensor routing_map;
};

/// TE's fused_topk_with_score_function, computed in float32 (float64 stays float64):
/// - softmax, use_pre_softmax: softmax over the experts, then the top-k of it;
/// - softmax otherwise: the top-k logits, then the softmax over those k;
/// - sigmoid / sqrtsoftplus: the scores; the top-k chosen by score + expert_bias ([experts],
///   used for the choice only) when given, else by score; the chosen scores divided by their
///   sum (+1e-20) when topk > 1.
/// Then times scaling_factor when set. Throws te::Error naming the option that cannot work.
Routing topk_with_score_function(const at::Tensor& logits, const RouterOptions& options,
                                 const at::Tensor& expert_bias = {});

/// TE's fused_compute_score_for_moe_aux_loss: the scores over every expert the load-balancing
/// loss weighs ([..., experts], float32: softmax; or sigmoid / sqrtsoftplus divided by their
/// sum) and the top-k of them as a routing map. Differentiable in the logits.
Routing compute_score_for_moe_aux_loss(const at::Tensor& logits, int64_t topk,
                                       TeChoice<ScoreFunction> score_function);

/// The switch load-balancing loss (TE's fused_moe_aux_loss, Megatron's
/// switch_load_balancing_loss_func):
///   Σ_e (Σ_t probs[t, e]) · tokens_per_expert[e] · experts · coeff / (topk · total_tokens²)
/// for probs [tokens, experts] (a rank's tokens) and tokens_per_expert [experts] counted over
/// the total_tokens the loss is taken over (this rank's, or the global batch's when the counts
/// were summed over the ranks). A scalar in float32 (float64 for float64 probs: TE returns the
/// probabilities' dtype), differentiable in probs only (the counts pass no gradient).
at::Tensor moe_aux_loss(const at::Tensor& probs, const at::Tensor& tokens_per_expert,
                        int64_t total_tokens, int64_t topk, double coeff);

/// Megatron's sequence-level load-balancing loss: the switch loss of each sequence on its own
/// tokens, averaged over the sequences. scores and routing_map are [batch, seqlen, experts],
/// te's batch-first layout (Megatron's tensors are sequence-first: transpose(0, 1) them).
at::Tensor moe_sequence_aux_loss(const at::Tensor& scores, const at::Tensor& routing_map,
                                 int64_t topk, double coeff);

/// Megatron's router z-loss (ST-MoE): mean over tokens of logsumexp(logits)², times coeff, in
/// float32 (float64 for float64 logits; Megatron keeps the logits' dtype). `valid` ([...],
/// bool, optional) counts only the tokens where it is true; no token counted gives 0.
at::Tensor moe_z_loss(const at::Tensor& logits, double coeff, const at::Tensor& valid = {});

/// Megatron's expert capacity: ceil(tokens · topk / experts · capacity_factor), at least
/// min_capacity.
int64_t moe_expert_capacity(int64_t tokens, int64_t topk, int64_t experts, double capacity_factor,
                            int64_t min_capacity = 0);

/// Megatron's apply_router_token_dropping on a Routing ([tokens, experts]): each expert keeps
/// at most moe_expert_capacity(...) tokens by `policy`; the dropped ones leave the map and their
/// probability becomes zero ("probs" ranks only the routed tokens' probabilities). With
/// pad_to_capacity every expert takes min(capacity, tokens) rows (the map becomes the kept
/// slots, including tokens not routed there, whose probability is 0).
Routing moe_drop_tokens(const Routing& routing, int64_t topk, double capacity_factor,
                        TeChoice<DropPolicy> policy = DropPolicy::kProbs,
                        bool pad_to_capacity = false);

/// Tokens grouped by expert: what moe_permute returns and moe_unpermute takes.
struct Permutation {
  /// [rows, hidden]: expert 0's tokens in token order, then expert 1's, ...; with alignment,
  /// each expert's rows followed by zero rows up to a multiple of it.
  at::Tensor tokens;
  /// [rows]: the routing probability of each row (moe_permute_with_probs), else undefined;
  /// zero on padding rows.
  at::Tensor probs;
  /// int64 [rows]: the input token each row holds (-1: a padding row).
  at::Tensor source;
  /// int64 [rows]: the row's place in the flattened routing map ([tokens, experts] for a mask
  /// map, [tokens, topk] for an index map): what merging probabilities are read at (-1: padding).
  at::Tensor slot;
  /// The rows of each expert's block of `tokens` (with alignment: padded), in expert order.
  std::vector<int64_t> rows_per_expert;
  int64_t num_tokens = 0;
  /// The routing map's width: experts (mask map) or topk (index map).
  int64_t slots_per_token = 0;
};

/// TE's moe_permute with a mask map: tokens [tokens, hidden], routing_map [tokens, experts]
/// (bool or integer, nonzero = routed); the rows are every routed pair (TE's num_out_tokens is
/// the buffer size its kernel writes into: here always the routed count, plus padding). `align` > 1
/// pads each expert's rows with zero rows to a multiple of it (TE's moe_permute_and_pad_with_probs;
/// FP8 GEMMs want 16 or 32).
Permutation moe_permute(const at::Tensor& tokens, const at::Tensor& routing_map, int64_t align = 1);

/// TE's moe_permute with an index map: indices [tokens, topk] (or [tokens]) of the experts each
/// token goes to; rows grouped by expert, stable in (token, k) order. `num_out_tokens` > 0
/// keeps only the first that many rows of that order (TE's, when tokens were dropped).
Permutation moe_permute_indices(const at::Tensor& tokens, const at::Tensor& indices,
                                int64_t num_experts, int64_t num_out_tokens = 0);

/// TE's moe_permute_with_probs (and moe_permute_and_pad_with_probs when align > 1): as
/// moe_permute, with each row's probability from probs [tokens, experts].
Permutation moe_permute_with_probs(const at::Tensor& tokens, const at::Tensor& probs,
                                   const at::Tensor& routing_map, int64_t align = 1);

/// TE's moe_unpermute: rows [rows, hidden] (the experts' outputs, in `map`'s order) back to
/// [tokens, hidden], each token's rows summed, each weighted by merging_probs at its slot when
/// given ([tokens, experts] for a mask map, [tokens, topk] for an index map). Padding rows are
/// dropped. (Without merging_probs TE's index map returns one row per slot, [tokens·topk,
/// hidden], and takes top-1 only; here the rows are summed, which is the same for top-1.)
at::Tensor moe_unpermute(const at::Tensor& rows, const Permutation& map,
                         const at::Tensor& merging_probs = {});

/// TE's moe_sort_chunks_by_index (its _with_probs form: call this on the probabilities too):
/// x [rows, ...] split into chunks of split_sizes rows (summing
/// to rows), put in the order sorted_index gives (a permutation of the chunks), as after an
/// expert-parallel all-to-all (chunks by source rank) to group them by local expert.
at::Tensor moe_sort_chunks_by_index(const at::Tensor& x, const std::vector<int64_t>& split_sizes,
                                    const std::vector<int64_t>& sorted_index);

}  // namespace te::nn::functional
