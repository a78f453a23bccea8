// The collectives behind every DTensor transition, on one mesh dim's row. Each picks the c10d
// primitive that bench/bench_collectives measured fastest on Gloo (configurable per world), and
// handles torch.chunk's uneven pieces.

#include <ATen/ATen.h>

#include <chrono>
#include <cstring>
#include <sstream>

#include "internal.h"
#include "te/distributed/comm_trace.h"
#include "te/error.h"

namespace te::detail {

namespace {

int64_t bytes_of(const at::Tensor& t) {
  return t.numel() * static_cast<int64_t>(t.element_size());
}

std::string ranks_text(const Group& g) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < g.ranks.size(); ++i) os << (i ? ", " : "") << g.ranks[i];
  os << "]";
  return os.str();
}

// Runs one c10d call and waits for it; any failure becomes a te::Error that names the
// collective, the mesh axis, the ranks of the row and this rank, and says what went wrong: a
// peer known to be gone, a wait that ran out the timeout, or (failing sooner, with every peer
// alive) an error of the backend itself, reported as such rather than blamed on the peers.
template <typename Launch>
void run(const Group& g, const char* what, Launch launch) {
  const auto start = std::chrono::steady_clock::now();
  try {
    auto work = launch();
    work->wait();
  } catch (const te::Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string missing = g.world ? g.world->describe_missing(g.ranks) : std::string();
    const auto waited = std::chrono::steady_clock::now() - start;
    const bool timed_out = waited >= g.timeout * 9 / 10;
    std::string cause;
    if (!missing.empty()) {
      cause = "missing " + missing;
    } else if (timed_out) {
      cause = "a peer rank did not arrive within " + std::to_string(g.timeout.count() / 1000.0) +
              " s (every rank must run the same collectives in the same order)";
    } else {
      cause = "the communication backend rejected the call (every peer is alive and it failed "
              "before the timeout)";
    }
    TE_FAIL(what, " over mesh axis '", g.axis, "' (ranks ", ranks_text(g), ") failed on rank ",
            g.world_rank, ": ", cause, ". c10d said: ", e.what());
  }
}

// What a collective is, in terms every rank of the row must agree on: the kind and its
// arguments, the dtype, and the shape with the dim whose pieces differ between ranks (uneven
// chunks) given whole.
std::string describe(const std::string& kind, const at::Tensor& t, int64_t whole_dim = -1,
                     int64_t whole = 0) {
  std::ostringstream os;
  os << kind << " of " << c10::toString(t.scalar_type()) << " [";
  for (int64_t d = 0; d < t.dim(); ++d) {
    os << (d ? ", " : "") << (d == whole_dim ? whole : t.size(d));
  }
  os << "]";
  return os.str();
}

// Desync detection (DistributedOptions::check_collectives): each rank of the row states the
// collective it is about to run; the statements are all-gathered in a fixed-size buffer (so the
// exchange itself always matches) and compared. A mismatch stops every rank with both calls.
void check_same_call(const Group& g, const std::string& call) {
  if (g.pg == nullptr || g.size <= 1 || g.world == nullptr ||
      !g.world->options().check_collectives) {
    return;
  }
  constexpr int64_t kBytes = 256;
  std::string mine = call + ", collective #" + std::to_string(g.calls->fetch_add(1) + 1) +
                     " on this row";
  if (static_cast<int64_t>(mine.size()) > kBytes) mine.resize(static_cast<std::size_t>(kBytes));
  at::Tensor buffer = at::zeros({kBytes}, at::kByte);
  std::memcpy(buffer.data_ptr<uint8_t>(), mine.data(), mine.size());
  std::vector<at::Tensor> inputs{buffer};
  std::vector<std::vector<at::Tensor>> outputs(1);
  for (int64_t r = 0; r < g.size; ++r) outputs[0].push_back(at::empty({kBytes}, at::kByte));
  run(g, "the collective check (check_collectives)", [&] {
    return g.pg->allgather(outputs, inputs);
  });
  for (int64_t r = 0; r < g.size; ++r) {
    const char* text = reinterpret_cast<const char*>(outputs[0][r].data_ptr<uint8_t>());
    const std::string theirs(text, strnlen(text, static_cast<std::size_t>(kBytes)));
    if (theirs != mine) {
      TE_FAIL("collectives out of step over mesh axis '", g.axis, "' (ranks ", ranks_text(g),
              "): rank ", g.world_rank, " runs ", mine, ", but rank ", g.ranks[r], " runs ",
              theirs, ". Every rank must run the same collectives in the same order on the same "
              "shapes: look for a constraint or collective only some ranks reach");
    }
  }
}

// The dtype a tensor crosses Gloo in. Gloo reduces no bools: 0/1 in uint8 reduce the same way
// under sum, max and min. LibTorch 1.13's Gloo has no bfloat16 at all, and would sum fp16 in fp16
// at every hop: both travel as fp32 (exact for them), are reduced there, and are rounded back
// once (restore_dtype), so every rank gets the same bits one process's fp32 sum would round to.
at::Tensor reducible(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBool:
      return t.to(at::kByte);
    case at::kBFloat16:
    case at::kHalf:
      return t.to(at::kFloat);
    default:
      return t;
  }
}
at::Tensor restore_dtype(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

c10d::ReduceOp c10d_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // summed, then divided: Gloo has no AVG
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
  }
  return c10d::ReduceOp::SUM;
}

// In-place all-reduce of a contiguous tensor.
void allreduce_inplace(const Group& g, at::Tensor& t, c10d::ReduceOp op, const char* what) {
  std::vector<at::Tensor> tensors{t};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  run(g, what, [&] { return g.pg->allreduce(tensors, options); });
}

// Exchanges flat pieces: piece s of `input` (numel in_sizes[s]) goes to row rank s; returns what
// arrived, piece s from row rank s (numel out_sizes[s]).
at::Tensor alltoall_flat(const Group& g, const at::Tensor& input, std::vector<int64_t> in_sizes,
                         std::vector<int64_t> out_sizes, at::ScalarType dtype, const char* what) {
  int64_t total = 0;
  for (int64_t n : out_sizes) total += n;
  at::Tensor output = at::empty({total}, input.options().dtype(dtype));
  at::Tensor in = input;
  run(g, what, [&] { return g.pg->alltoall_base(output, in, out_sizes, in_sizes); });
  return output;
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t v : shape) n *= v;
  return n;
}

std::vector<int64_t> shape_with(at::IntArrayRef sizes, int64_t dim, int64_t value) {
  std::vector<int64_t> out(sizes.begin(), sizes.end());
  out[static_cast<std::size_t>(dim)] = value;
  return out;
}

}  // namespace

at::Tensor all_gather(const Group& g, const at::Tensor& local_in, int64_t dim, int64_t full) {
  check_same_call(g, describe("all_gather(dim " + std::to_string(dim) + ")", local_in, dim, full));
  // Gloo moves no bools: carry them as uint8.
  const at::Tensor local = reducible(local_in);
  const Chunk mine = chunk_of(full, g.size, g.rank);
  TE_CHECK(local.size(dim) == mine.length, "all_gather over mesh axis '", g.axis, "': rank ",
           g.world_rank, " holds ", local.size(dim), " of dim ", dim, ", expected ", mine.length,
           " (torch.chunk of ", full, " over ", g.size, ")");
  const auto full_shape = shape_with(local.sizes(), dim, full);
  if (g.size == 1) return local_in.clone();
  const at::ScalarType dtype = local.scalar_type();
  at::Tensor out;
  std::string primitive;
  switch (g.algorithms.gather) {
    case GatherAlgorithm::kPaddedAllReduce: {
      // Zeros everywhere but this rank's chunk; the sum is the concatenation (x + 0 == x).
      out = at::zeros(full_shape, local.options());
      if (mine.length > 0) out.narrow(dim, mine.offset, mine.length).copy_(local);
      allreduce_inplace(g, out, c10d::ReduceOp::SUM, "all_gather");
      primitive = "allreduce";
      break;
    }
    case GatherAlgorithm::kAllGather: {
      const int64_t longest = chunk_of(full, g.size, 0).length;
      at::Tensor padded = at::zeros(shape_with(local.sizes(), dim, longest), local.options());
      if (mine.length > 0) padded.narrow(dim, 0, mine.length).copy_(local);
      std::vector<at::Tensor> inputs{padded};
      std::vector<std::vector<at::Tensor>> outputs(1);
      for (int64_t s = 0; s < g.size; ++s) outputs[0].push_back(at::empty_like(padded));
      run(g, "all_gather", [&] { return g.pg->allgather(outputs, inputs); });
      std::vector<at::Tensor> pieces;
      for (int64_t s = 0; s < g.size; ++s) {
        pieces.push_back(outputs[0][s].narrow(dim, 0, chunk_of(full, g.size, s).length));
      }
      out = at::cat(pieces, dim);
      primitive = "allgather";
      break;
    }
    case GatherAlgorithm::kAllToAll: {
      at::Tensor flat = local.contiguous().reshape({-1});
      at::Tensor input = flat.repeat({g.size});
      std::vector<int64_t> in_sizes(static_cast<std::size_t>(g.size), flat.numel());
      std::vector<int64_t> out_sizes;
      std::vector<std::vector<int64_t>> shapes;
      for (int64_t s = 0; s < g.size; ++s) {
        shapes.push_back(shape_with(local.sizes(), dim, chunk_of(full, g.size, s).length));
        out_sizes.push_back(numel_of(shapes.back()));
      }
      at::Tensor received = alltoall_flat(g, input, in_sizes, out_sizes, dtype, "all_gather");
      std::vector<at::Tensor> pieces;
      int64_t offset = 0;
      for (int64_t s = 0; s < g.size; ++s) {
        pieces.push_back(received.narrow(0, offset, out_sizes[s]).view(shapes[s]));
        offset += out_sizes[s];
      }
      out = at::cat(pieces, dim);
      primitive = "alltoall_base";
      break;
    }
  }
  out = restore_dtype(out, local_in.scalar_type());
  CommTrace::record({Collective::kAllGather, g.axis, bytes_of(out), primitive});
  return out;
}

at::Tensor all_reduce(const Group& g, const at::Tensor& t, ReduceOp op) {
  check_same_call(g, describe("all_reduce(" + to_string(op) + ")", t));
  TE_CHECK(op != ReduceOp::kAvg || at::isFloatingType(t.scalar_type()),
           "all_reduce over mesh axis '", g.axis, "': Partial(avg) of a ", t.scalar_type(),
           " tensor would truncate; use a floating dtype or Partial(sum)");
  if (g.size == 1) return t.clone();
  const at::ScalarType dtype = t.scalar_type();
  at::Tensor out = reducible(t).contiguous().clone();
  allreduce_inplace(g, out, c10d_op(op), "all_reduce");
  if (op == ReduceOp::kAvg) out.div_(static_cast<double>(g.size));
  CommTrace::record({Collective::kAllReduce, g.axis, bytes_of(t), "allreduce"});
  return restore_dtype(out, dtype);
}

at::Tensor reduce_scatter(const Group& g, const at::Tensor& t, ReduceOp op, int64_t dim) {
  check_same_call(g, describe("reduce_scatter(" + to_string(op) + ", dim " + std::to_string(dim) +
                                  ")",
                              t));
  TE_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg,
           "internal: reduce_scatter takes sum or avg, got ", to_string(op));
  TE_CHECK(op != ReduceOp::kAvg || at::isFloatingType(t.scalar_type()),
           "reduce_scatter over mesh axis '", g.axis, "': Partial(avg) of a ", t.scalar_type(),
           " tensor would truncate; use a floating dtype or Partial(sum)");
  const int64_t full = t.size(dim);
  const Chunk mine = chunk_of(full, g.size, g.rank);
  if (g.size == 1) return t.clone();
  const at::ScalarType dtype = t.scalar_type();
  at::Tensor out;
  std::string primitive;
  switch (g.algorithms.reduce_scatter) {
    case ReduceScatterAlgorithm::kAllReduceSlice: {
      at::Tensor reduced = reducible(t).contiguous().clone();
      allreduce_inplace(g, reduced, c10d::ReduceOp::SUM, "reduce_scatter");
      out = reduced.narrow(dim, mine.offset, mine.length).clone();
      primitive = "allreduce";
      break;
    }
    case ReduceScatterAlgorithm::kAllToAllSum: {
      // Chunk s of `dim` goes to row rank s; what arrives is everyone's copy of this rank's
      // chunk, summed locally.
      at::Tensor moved = reducible(t).movedim(dim, 0).contiguous();
      const int64_t inner = moved.numel() / std::max<int64_t>(full, 1);
      std::vector<int64_t> in_sizes;
      for (int64_t s = 0; s < g.size; ++s) {
        in_sizes.push_back(chunk_of(full, g.size, s).length * inner);
      }
      std::vector<int64_t> out_sizes(static_cast<std::size_t>(g.size), mine.length * inner);
      at::Tensor received = alltoall_flat(g, moved.reshape({-1}), in_sizes, out_sizes,
                                          moved.scalar_type(), "reduce_scatter");
      std::vector<int64_t> piece_shape(moved.sizes().begin(), moved.sizes().end());
      piece_shape[0] = mine.length;
      std::vector<int64_t> stacked{g.size};
      stacked.insert(stacked.end(), piece_shape.begin(), piece_shape.end());
      out = received.view(stacked).sum(0, false, moved.scalar_type()).movedim(0, dim).contiguous();
      primitive = "alltoall_base";
      break;
    }
  }
  if (op == ReduceOp::kAvg) out.div_(static_cast<double>(g.size));
  CommTrace::record({Collective::kReduceScatter, g.axis, bytes_of(t), primitive});
  return restore_dtype(out, dtype);
}

at::Tensor all_to_all(const Group& g, const at::Tensor& local_in, int64_t from_dim,
                      int64_t from_full, int64_t to_dim) {
  check_same_call(g, describe("all_to_all(dim " + std::to_string(from_dim) + " -> " +
                                  std::to_string(to_dim) + ")",
                              local_in, from_dim, from_full));
  const at::Tensor local = reducible(local_in);
  const Chunk mine_from = chunk_of(from_full, g.size, g.rank);
  TE_CHECK(local.size(from_dim) == mine_from.length, "all_to_all over mesh axis '", g.axis,
           "': rank ", g.world_rank, " holds ", local.size(from_dim), " of dim ", from_dim,
           ", expected ", mine_from.length);
  const int64_t to_full = local.size(to_dim);
  const Chunk mine_to = chunk_of(to_full, g.size, g.rank);
  if (g.size == 1) return local_in.clone();
  // Piece s: this rank's rows of from_dim, row rank s's chunk of to_dim.
  std::vector<at::Tensor> send;
  std::vector<int64_t> in_sizes;
  for (int64_t s = 0; s < g.size; ++s) {
    const Chunk c = chunk_of(to_full, g.size, s);
    send.push_back(local.narrow(to_dim, c.offset, c.length).contiguous().reshape({-1}));
    in_sizes.push_back(send.back().numel());
  }
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> out_sizes;
  for (int64_t s = 0; s < g.size; ++s) {
    auto shape = shape_with(local.sizes(), to_dim, mine_to.length);
    shape[static_cast<std::size_t>(from_dim)] = chunk_of(from_full, g.size, s).length;
    out_sizes.push_back(numel_of(shape));
    shapes.push_back(shape);
  }
  at::Tensor received = alltoall_flat(g, at::cat(send), in_sizes, out_sizes,
                                      local.scalar_type(), "all_to_all");
  std::vector<at::Tensor> pieces;
  int64_t offset = 0;
  for (int64_t s = 0; s < g.size; ++s) {
    pieces.push_back(received.narrow(0, offset, out_sizes[s]).view(shapes[s]));
    offset += out_sizes[s];
  }
  at::Tensor out = restore_dtype(at::cat(pieces, from_dim), local_in.scalar_type());
  CommTrace::record({Collective::kAllToAll, g.axis, bytes_of(local_in), "alltoall_base"});
  return out;
}

}  // namespace te::detail
