// Packed sequences' token layouts on a DTensor (modules/src/forward.h): a batch of one and back,
// and rows of packed sequences handed to a function with the context parallel size and rank of
// their tokens.

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "forward.h"
#include "te/distributed/dtensor.h"
#include "te/error.h"

namespace te::nn {

namespace detail {

namespace {
// `dim` of t holds the packed tokens, or (tokens_only's dim 0) the batch of one they are in;
// under context parallelism the tokens may be split (over the cp axes: attention checks which).
void check_whole_tokens(const DTensor& t, int64_t dim, bool context_parallel = false) {
  for (std::size_t m = 0; m < t.placements().size(); ++m) {
    if (is_shard(t.placements()[m], dim) && context_parallel) continue;
    TE_CHECK(!is_shard(t.placements()[m], dim), "qkv_format 'thd': the packed tokens ",
             t.to_string(), " are split over mesh axis '", t.mesh().axis_names()[m], "' (dim ", dim,
             ": each sequence needs all its keys on one rank): replicate the tokens and shard "
             "the heads, or give each rank its own packed batch (rules that shard 'batch' or "
             "'seqlen' there split them), or split them over one axis with cp_comm_type "
             "(context parallelism)");
  }
}
std::vector<Placement> shifted(std::vector<Placement> p, int64_t by) {
  for (Placement& x : p) {
    if (is_shard(x)) x = Shard{std::get<Shard>(x).dim + by};
  }
  return p;
}
}  // namespace

DTensor batch_of_one(const DTensor& t, bool context_parallel) {
  check_whole_tokens(t, 0, context_parallel);
  std::vector<int64_t> shape = t.sizes();
  shape.insert(shape.begin(), 1);
  return DTensor::from_local(t.to_local().unsqueeze(0), t.mesh(), shifted(t.placements(), 1),
                             shape);
}

DTensor tokens_only(const DTensor& t, bool context_parallel) {
  check_whole_tokens(t, 0);
  check_whole_tokens(t, 1, context_parallel);
  std::vector<int64_t> shape = t.sizes();
  shape.erase(shape.begin());
  return DTensor::from_local(t.to_local().squeeze(0), t.mesh(), shifted(t.placements(), -1), shape);
}

DTensor on_packed_rows(const DTensor& x, const RowsFn& fn, bool context_parallel) {
  const int64_t last = x.dim() - 1;
  int64_t cp_size = 1, cp_rank = 0;
  for (std::size_t m = 0; m < x.placements().size(); ++m) {
    const Placement& p = x.placements()[m];
    const auto dim = static_cast<int64_t>(m);
    if (is_shard(p, 1) && context_parallel) {  // (a2a+p2p: two axes, major to minor)
      cp_rank = cp_rank * x.mesh().size(dim) + x.mesh().coordinate(dim);
      cp_size *= x.mesh().size(dim);
      continue;
    }
    TE_CHECK(!is_partial(p) && !is_shard(p, 1) && !is_shard(p, last), "rows of packed sequences ",
             x.to_string(), " are ", is_partial(p) ? "a partial sum" : "split on their tokens",
             " over mesh axis '", x.mesh().axis_names()[m],
             "': each sequence needs its tokens on one rank; split the rows (batch) instead");
  }
  const auto piece = local_chunks(x.sizes(), x.mesh(), x.placements(), x.mesh().rank());
  const at::Tensor out = fn(x.to_local(), piece[0].offset, cp_size, cp_rank);
  std::vector<int64_t> shape = x.sizes();
  shape.back() = out.size(-1);
  return DTensor::from_local(out, x.mesh(), x.placements(), shape);
}

}  // namespace detail

}  // namespace te::nn
