#pragma once

// The gradient norm of a model whose parameters are sharded over a mesh, and clipping by it.
//
// torch::nn::utils::clip_grad_norm_ over each rank's local shards gives each rank the norm of
// its own pieces and its own coefficient: the replicas diverge, with no error. Here every element
// of the global gradient counts once (Megatron-LM optimizer/clip_grads.py get_grad_norm_fp32,
// torchtitan distributed/utils.py clip_grad_norm_): a parameter Shard-ed over mesh dims has its
// local sum of |g|^p summed over those dims, a Replicate-d one (data-parallel copies, the copies a
// tensor-parallel layer keeps of its norms and biases) is counted once; one all-reduce per set of
// mesh dims, so every rank gets the same norm and the same coefficient. Each local piece's norm
// is taken in double and the p-th powers summed.
//
// Example (after loss.backward() and, for data parallelism, GradientBuckets::finish()):
//   const double norm = te::optim::clip_grad_norm(*model, /*max_norm=*/1.0);
//   optimizer.step();

#include <torch/nn/module.h>

namespace te::optim {

/// The p-norm (`norm_type` > 0, or infinity) of the whole gradient of `module`'s parameters
/// (those without a gradient count as zero), the same on every rank. Collective over the meshes
/// the parameters are sharded on: every rank calls it with the same module layout. Parameters of
/// modules that are not te::nn ones count as whole, once.
double grad_norm(const torch::nn::Module& module, double norm_type = 2.0);

/// Scales every gradient by max_norm / (norm + 1e-6) when that is below 1, as
/// torch.nn.utils.clip_grad_norm_ does, with the norm of grad_norm; returns that norm (before
/// clipping). te::Error when max_norm is not positive or norm_type not > 0; a non-finite norm is
/// returned and nothing is scaled when `error_if_nonfinite` is false (else te::Error).
double clip_grad_norm(torch::nn::Module& module, double max_norm, double norm_type = 2.0,
                      bool error_if_nonfinite = false);

}  // namespace te::optim
