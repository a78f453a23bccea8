#pragma once

// Gloo's own choices: which c10d primitive carries an all-gather or a reduce-scatter on a Gloo
// communicator (other backends have native ones and ignore them). Gloo (LibTorch 1.13) has no
// reduce-scatter and a slow all-gather; the defaults are the fastest on the CI machine
// (bench/bench_collectives; docs/results.md, "Benchmarks").

namespace te {

enum class GatherAlgorithm {
  kPaddedAllReduce,  ///< each rank writes its chunk into a zeroed full buffer; all-reduce(sum)
  kAllGather,        ///< c10d allgather of equal (padded) chunks
  kAllToAll,         ///< c10d alltoall_base, each rank sending its chunk to every rank
};
enum class ReduceScatterAlgorithm {
  kAllReduceSlice,  ///< all-reduce the full tensor, keep this rank's chunk
  kAllToAllSum,     ///< alltoall_base the chunks, reduce locally
};

/// The primitives behind all-gather and reduce-scatter (all-reduce and all-to-all are direct).
struct CollectiveAlgorithms {
  GatherAlgorithm gather = GatherAlgorithm::kPaddedAllReduce;
  ReduceScatterAlgorithm reduce_scatter = ReduceScatterAlgorithm::kAllToAllSum;
};

}  // namespace te
