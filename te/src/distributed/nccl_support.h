#pragma once

// What the NCCL backend decides before it touches a GPU: the type and operator mappings, the
// unique-id exchange and the one-GPU-per-rank check. Testable wherever this build has NCCL.

#include <ATen/Tensor.h>
#include <nccl.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "te/distributed/placement.h"

namespace te::detail::nccl {

/// The NCCL type a reduction of `dtype` runs in (bools travel as uint8; the caller converts);
/// te::Error naming the dtype for one NCCL cannot reduce.
ncclDataType_t reduce_type(at::ScalarType dtype);
/// sum, avg (native), max, min.
ncclRedOp_t reduce_op(ReduceOp op);
/// Rank 0 makes the id (ncclGetUniqueId) and sets it under "nccl_id" in `store`; every rank
/// gets it from there (waiting up to the store's timeout) and returns it.
ncclUniqueId share_unique_id(c10d::Store& store, int rank);
/// The first two ranks whose GPU identity (PCI bus id) is the same, if any.
std::optional<std::pair<int, int>> shared_gpu(const std::vector<std::string>& gpu_of_rank);

}  // namespace te::detail::nccl
