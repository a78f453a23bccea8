#pragma once

// The block-wise strategies of context parallel attention (context_parallel_blocks.cpp), and
// the checks every strategy makes first (context_parallel.cpp): internal to te::nn.

#include <ATen/Tensor.h>

#include <vector>

#include "te/distributed/placement.h"
#include "te/nn/context_parallel.h"

namespace te::nn::functional::detail {

/// Placements that put `p` on cp's mesh dim and Replicate on every other (a redistribute of
/// them moves along cp's axis only).
std::vector<Placement> over_cp(const ContextParallel& cp, Placement p);

/// te::Error naming what context_parallel_attention cannot take (TE's refusals, and what te
/// does not take yet).
void check_context_parallel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionCall& call, const ContextParallel& cp);
/// cp_comm_type "p2p": K/V round the ring, partial results merged by log-sum-exp (te's fused
/// kernel; the unfused path, K/V received round the ring first, for what it does not take).
at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionCall& call, const ContextParallel& cp);
/// cp_comm_type "all_gather": K/V gathered, each query chunk attending once.
at::Tensor gathered_kv_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const AttentionCall& call, const ContextParallel& cp);

}  // namespace te::nn::functional::detail
