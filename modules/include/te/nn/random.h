#pragma once

// Layout-invariant random ops. Dropout draws its mask from a counter-based generator
// (Philox 4x32-10, te/kernels/philox.h) keyed by this thread's seed, the index of the random call
// and each element's position in the *global* tensor. Every rank computes only the piece of the
// mask it holds, and that piece equals the same slice of one process's mask: a replicated tensor
// gets bit-identical masks on every replica, a sharded one the slice of the global mask, so
// training under any layout computes what one process computes.

#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

#include "te/distributed/dtensor.h"

namespace te::nn {

/// This thread's dropout stream: the seed and how many random calls it has made. Every rank
/// makes the same calls in the same order (one per dropout on a tensor of the same global
/// shape), so the counts agree without communication. te::nn::manual_seed(s) sets {s, 0}.
struct RngState {
  uint64_t seed = 0;
  uint64_t calls = 0;
};

/// The current state of this thread's stream (threads start at {0, 0}).
RngState rng_state();
/// Restores a state saved with rng_state() (e.g. to replay a step, or to resume training).
void set_rng_state(const RngState& state);

}  // namespace te::nn

namespace te::nn::functional {

/// Dropout of a whole tensor (one device): each element zeroed with probability p, the rest
/// multiplied by 1 / (1 - p); the identity when !training or p == 0. Advances the stream by one
/// call. Differentiable in x. te::Error for p outside [0, 1).
at::Tensor dropout(const at::Tensor& x, double p, bool training);

/// Dropout of `local`, the piece at `offsets` of a tensor of `global_shape`: the values one
/// process's dropout(global) has there. Every holder of a piece must make this call.
at::Tensor dropout(const at::Tensor& local, double p, bool training,
                   const std::vector<int64_t>& global_shape, const std::vector<int64_t>& offsets);

/// Dropout of rows gathered from a global [rows, columns] tensor (`global_shape`): row i of
/// `local` [n, width] is global row row_ids[i] (int64 [n]), its columns col_offset ..
/// col_offset + width - 1; the values one process's dropout of the global tensor has there. For
/// rows moved by a permutation or an all-to-all (a mixture of experts' rows: token · experts +
/// expert), so that the mask follows the row wherever it runs. One call on the stream, as
/// dropout's; every rank must make it (with n = 0 where it holds no row).
at::Tensor dropout_rows(const at::Tensor& local, double p, bool training,
                        const std::vector<int64_t>& global_shape, const at::Tensor& row_ids,
                        int64_t col_offset);

/// Dropout of a DTensor: each rank masks its own piece with its slice of the global mask, so the
/// result equals one process's dropout of the full tensor on every layout. A Partial x keeps its
/// placement: every partial summand gets the same (non-negative) mask, and
/// sum_r(m * x_r) = m * sum_r(x_r) (max and min commute with m >= 0 likewise), so no
/// communication is needed.
DTensor dropout(const DTensor& x, double p, bool training);

/// Stochastic depth (TE's DropPath, transformer_engine/pytorch/transformer.py L45-67 at
/// d0067d0da): each sample (row of dim 0, the batch) of x is zeroed with probability p, the rest
/// multiplied by 1 / (1 - p); the identity when !training or p == 0. The per-sample draw is
/// dropout's on a [batch, 1, ...] tensor, so every layout drops the samples one process drops.
/// TE draws over dim 0 of its [seqlen, batch, hidden] default, i.e. per position; te's inputs are
/// [batch, seqlen, hidden], so te drops whole samples, as TE does with bshd inputs.
at::Tensor drop_path(const at::Tensor& x, double p, bool training);
DTensor drop_path(const DTensor& x, double p, bool training);

}  // namespace te::nn::functional
