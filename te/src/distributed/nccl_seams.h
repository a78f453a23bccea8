#pragma once

// What the NCCL backend decides before it touches a GPU, apart so the tests can hold each
// decision without one (nccl_backend.cpp; te::Error where comm::nccl_built() is false). Not a
// public header: the tests reach it through te/src.

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "te/distributed/placement.h"

namespace te::comm {

/// The ncclDataType_t a reduction of `dtype` runs in (bools travel as uint8); te::Error naming
/// the dtype for one NCCL cannot reduce.
int nccl_reduce_type(at::ScalarType dtype);
/// The ncclRedOp_t of `op` (avg is native).
int nccl_reduce_op(ReduceOp op);
/// Rank 0 makes an ncclUniqueId and sets it under "nccl_id" in `store`; every rank gets it from
/// there (waiting up to `timeout`) and returns its bytes.
std::vector<uint8_t> nccl_share_unique_id(c10d::Store& store, int rank,
                                          std::chrono::milliseconds timeout);
/// The first two ranks whose GPU identity (PCI bus id) is the same, if any: NCCL refuses them.
std::optional<std::pair<int, int>> shared_gpu(const std::vector<std::string>& gpu_of_rank);

/// What one rank of a communicator can say before it joins: the GPU it would use (its PCI bus
/// id), or why it cannot join. Every rank posts one, then reads all, so a rank that cannot join
/// stops its peers at once instead of leaving them waiting on keys it never sets.
struct PeerStatus {
  std::string gpu;    ///< PCI bus id; empty when `error` says why there is none
  std::string error;  ///< empty when the rank can join
};
/// Posts this rank's status under "status/<rank>" in `store` and returns every rank's, in order,
/// once all are there. Throws te::Error at once when this rank's own status is an error (its
/// text), when a peer posted one (naming that rank and its reason), and after `timeout` naming
/// the ranks that posted nothing. `ranks` are the world ranks of the row, for messages.
std::vector<PeerStatus> exchange_peer_status(c10d::Store& store, int rank,
                                             const std::vector<int64_t>& ranks,
                                             const PeerStatus& mine,
                                             std::chrono::milliseconds timeout);

}  // namespace te::comm
