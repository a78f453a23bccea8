// The collectives behind every DTensor transition, on one mesh dim's row, written against the
// backend interface (backend.h) only: they handle torch.chunk's uneven pieces and layouts, the
// dtype a reduction runs in, desync checks, CommTrace and the wording of failures; the backend
// the tensor's device selects (Gloo, NCCL) moves the bytes.

#include <ATen/ATen.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <sstream>

#include "internal.h"
#include "te/distributed/comm_trace.h"
#include "te/error.h"

namespace te::detail {

namespace {

int64_t bytes_of(const at::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

std::string ranks_text(const Group& g) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < g.ranks.size(); ++i) os << (i ? ", " : "") << g.ranks[i];
  os << "]";
  return os.str();
}

// Runs one backend call; any failure becomes a te::Error that names the collective, the mesh
// axis, the ranks of the row and this rank, and says what went wrong: a peer known to be gone, a
// wait that ran out the timeout, or (failing sooner, with every peer alive) an error of the
// backend itself, reported as such rather than blamed on the peers.
template <typename Call>
const char* run(const Group& g, const char* what, Call call) {
  const auto start = std::chrono::steady_clock::now();
  try {
    return call();
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
      cause =
          "the communication backend rejected the call (every peer is alive and it failed "
          "before the timeout)";
    }
    TE_FAIL(what, " over mesh axis '", g.axis, "' (ranks ", ranks_text(g), ") failed on rank ",
            g.world_rank, ": ", cause, ". The backend said: ", e.what());
  }
}

Backend& backend_for(const Group& g, const at::Tensor& t) {
  return g.comm->for_device(t.device(), g.axis);
}

// Moves carry raw bytes, so any dtype crosses any backend unchanged: a contiguous tensor's flat
// bytes, and back.
at::Tensor as_bytes(const at::Tensor& t) { return t.contiguous().reshape({-1}).view(at::kByte); }
at::Tensor from_bytes(const at::Tensor& bytes, at::ScalarType dtype, at::IntArrayRef shape) {
  return bytes.view(dtype).view(shape);
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
void check_same_call(const Group& g, const std::string& call, const at::Tensor& like) {
  if (g.comm == nullptr || g.size <= 1 || g.world == nullptr ||
      !g.world->options().check_collectives) {
    return;
  }
  constexpr int64_t kBytes = 256;
  std::string mine =
      call + ", collective #" + std::to_string(g.calls->fetch_add(1) + 1) + " on this row";
  if (static_cast<int64_t>(mine.size()) > kBytes) mine.resize(static_cast<std::size_t>(kBytes));
  at::Tensor buffer = at::zeros({kBytes}, at::kByte);
  std::memcpy(buffer.data_ptr<uint8_t>(), mine.data(), mine.size());
  // On the collective's own device, so the check runs on the backend the collective will.
  const at::Tensor sent = buffer.to(like.device());
  at::Tensor gathered = at::empty({g.size * kBytes}, sent.options());
  Backend& backend = backend_for(g, like);
  run(g, "the collective check (check_collectives)",
      [&] { return backend.all_gather(sent, gathered); });
  gathered = gathered.cpu();
  for (int64_t r = 0; r < g.size; ++r) {
    const char* text = reinterpret_cast<const char*>(gathered.data_ptr<uint8_t>() + r * kBytes);
    const std::string theirs(text, strnlen(text, static_cast<std::size_t>(kBytes)));
    if (theirs != mine) {
      TE_FAIL("collectives out of step over mesh axis '", g.axis, "' (ranks ", ranks_text(g),
              "): rank ", g.world_rank, " runs ", mine, ", but rank ", g.ranks[r], " runs ", theirs,
              ". Every rank must run the same collectives in the same order on the same "
              "shapes: look for a constraint or collective only some ranks reach");
    }
  }
}

at::Tensor restore_dtype(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t : t.to(dtype);
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

// Concatenates torch.chunk pieces of `dim` that may differ by one row: each rank sends its piece
// padded to the longest, the padding is dropped on arrival.
at::Tensor all_gather(const Group& g, const at::Tensor& local, int64_t dim, int64_t full) {
  check_same_call(g, describe("all_gather(dim " + std::to_string(dim) + ")", local, dim, full),
                  local);
  const Chunk mine = chunk_of(full, g.size, g.rank);
  TE_CHECK(local.size(dim) == mine.length, "all_gather over mesh axis '", g.axis, "': rank ",
           g.world_rank, " holds ", local.size(dim), " of dim ", dim, ", expected ", mine.length,
           " (torch.chunk of ", full, " over ", g.size, ")");
  if (g.size == 1) return local.clone();
  Backend& backend = backend_for(g, local);
  const at::Tensor moved = local.movedim(dim, 0);
  const int64_t longest = chunk_of(full, g.size, 0).length;
  at::Tensor padded = moved;
  if (mine.length != longest) {
    padded = at::zeros(shape_with(moved.sizes(), 0, longest), local.options());
    if (mine.length > 0) padded.narrow(0, 0, mine.length).copy_(moved);
  }
  const at::Tensor in = as_bytes(padded);
  at::Tensor out = at::empty({g.size * in.numel()}, in.options());
  const char* primitive = run(g, "all_gather", [&] { return backend.all_gather(in, out); });
  std::vector<int64_t> stacked{g.size};
  stacked.insert(stacked.end(), padded.sizes().begin(), padded.sizes().end());
  const at::Tensor pieces = from_bytes(out, local.scalar_type(), stacked);
  at::Tensor whole;
  if (full == g.size * longest) {
    whole = pieces.view(shape_with(padded.sizes(), 0, full));
  } else {
    std::vector<at::Tensor> parts;
    for (int64_t s = 0; s < g.size; ++s) {
      parts.push_back(pieces[s].narrow(0, 0, chunk_of(full, g.size, s).length));
    }
    whole = at::cat(parts, 0);
  }
  if (dim != 0) whole = whole.movedim(0, dim).contiguous();
  CommTrace::record({Collective::kAllGather, g.axis, bytes_of(whole), primitive});
  return whole;
}

at::Tensor all_reduce(const Group& g, const at::Tensor& t, ReduceOp op) {
  check_same_call(g, describe("all_reduce(" + to_string(op) + ")", t), t);
  TE_CHECK(op != ReduceOp::kAvg || at::isFloatingType(t.scalar_type()),
           "all_reduce over mesh axis '", g.axis, "': Partial(avg) of a ", t.scalar_type(),
           " tensor would truncate; use a floating dtype or Partial(sum)");
  if (g.size == 1) return t.clone();
  Backend& backend = backend_for(g, t);
  const at::ScalarType wire = backend.reduce_dtype(t.scalar_type());
  at::Tensor out = wire == t.scalar_type() ? t.contiguous().clone() : t.to(wire).contiguous();
  at::Tensor flat = out.view({-1});
  const char* primitive = run(g, "all_reduce", [&] { return backend.all_reduce(flat, op); });
  CommTrace::record({Collective::kAllReduce, g.axis, bytes_of(t), primitive});
  return restore_dtype(out, t.scalar_type());
}

// Reduces, then keeps this rank's torch.chunk piece of `dim`: pieces padded to the longest go in,
// the padding of this rank's is dropped.
at::Tensor reduce_scatter(const Group& g, const at::Tensor& t, ReduceOp op, int64_t dim) {
  check_same_call(
      g, describe("reduce_scatter(" + to_string(op) + ", dim " + std::to_string(dim) + ")", t), t);
  TE_CHECK(op == ReduceOp::kSum || op == ReduceOp::kAvg,
           "internal: reduce_scatter takes sum or avg, got ", to_string(op));
  TE_CHECK(op != ReduceOp::kAvg || at::isFloatingType(t.scalar_type()),
           "reduce_scatter over mesh axis '", g.axis, "': Partial(avg) of a ", t.scalar_type(),
           " tensor would truncate; use a floating dtype or Partial(sum)");
  const int64_t full = t.size(dim);
  const Chunk mine = chunk_of(full, g.size, g.rank);
  if (g.size == 1) return t.clone();
  Backend& backend = backend_for(g, t);
  const at::ScalarType wire = backend.reduce_dtype(t.scalar_type());
  const at::Tensor moved = t.movedim(dim, 0).to(wire);
  const int64_t longest = chunk_of(full, g.size, 0).length;
  at::Tensor padded;
  if (full == g.size * longest) {
    padded = moved.contiguous();
  } else {
    padded = at::zeros(shape_with(moved.sizes(), 0, g.size * longest), moved.options());
    for (int64_t s = 0; s < g.size; ++s) {
      const Chunk c = chunk_of(full, g.size, s);
      if (c.length > 0)
        padded.narrow(0, s * longest, c.length).copy_(moved.narrow(0, c.offset, c.length));
    }
  }
  const auto piece_shape = shape_with(moved.sizes(), 0, longest);
  at::Tensor out = at::empty(piece_shape, padded.options());
  at::Tensor in_flat = padded.view({-1});
  at::Tensor out_flat = out.view({-1});
  const char* primitive =
      run(g, "reduce_scatter", [&] { return backend.reduce_scatter(in_flat, out_flat, op); });
  at::Tensor result = out.narrow(0, 0, mine.length);
  result = dim == 0 ? result.contiguous() : result.movedim(0, dim).contiguous();
  CommTrace::record({Collective::kReduceScatter, g.axis, bytes_of(t), primitive});
  return restore_dtype(result, t.scalar_type());
}

at::Tensor all_to_all(const Group& g, const at::Tensor& local, int64_t from_dim, int64_t from_full,
                      int64_t to_dim) {
  check_same_call(
      g,
      describe("all_to_all(dim " + std::to_string(from_dim) + " -> " + std::to_string(to_dim) + ")",
               local, from_dim, from_full),
      local);
  const Chunk mine_from = chunk_of(from_full, g.size, g.rank);
  TE_CHECK(local.size(from_dim) == mine_from.length, "all_to_all over mesh axis '", g.axis,
           "': rank ", g.world_rank, " holds ", local.size(from_dim), " of dim ", from_dim,
           ", expected ", mine_from.length);
  const int64_t to_full = local.size(to_dim);
  const Chunk mine_to = chunk_of(to_full, g.size, g.rank);
  if (g.size == 1) return local.clone();
  Backend& backend = backend_for(g, local);
  const int64_t item = static_cast<int64_t>(local.element_size());
  // Piece s: this rank's rows of from_dim, row rank s's chunk of to_dim.
  std::vector<at::Tensor> send;
  std::vector<int64_t> in_sizes;
  for (int64_t s = 0; s < g.size; ++s) {
    const Chunk c = chunk_of(to_full, g.size, s);
    send.push_back(as_bytes(local.narrow(to_dim, c.offset, c.length)));
    in_sizes.push_back(send.back().numel());
  }
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> out_sizes;
  for (int64_t s = 0; s < g.size; ++s) {
    auto shape = shape_with(local.sizes(), to_dim, mine_to.length);
    shape[static_cast<std::size_t>(from_dim)] = chunk_of(from_full, g.size, s).length;
    out_sizes.push_back(numel_of(shape) * item);
    shapes.push_back(shape);
  }
  const at::Tensor in = at::cat(send);
  at::Tensor received =
      at::empty({std::accumulate(out_sizes.begin(), out_sizes.end(), int64_t{0})}, in.options());
  const char* primitive =
      run(g, "all_to_all", [&] { return backend.all_to_all(in, received, in_sizes, out_sizes); });
  std::vector<at::Tensor> pieces;
  int64_t offset = 0;
  for (int64_t s = 0; s < g.size; ++s) {
    pieces.push_back(
        from_bytes(received.narrow(0, offset, out_sizes[s]), local.scalar_type(), shapes[s]));
    offset += out_sizes[s];
  }
  at::Tensor out = at::cat(pieces, from_dim);
  CommTrace::record({Collective::kAllToAll, g.axis, bytes_of(local), primitive});
  return out;
}

at::Tensor all_to_all_rows(const Group& g, const at::Tensor& rows,
                           const std::vector<int64_t>& send_rows,
                           const std::vector<int64_t>& recv_rows) {
  const auto n = static_cast<std::size_t>(g.size);
  TE_CHECK(rows.dim() >= 1 && send_rows.size() == n && recv_rows.size() == n,
           "all_to_all_rows over mesh axis '", g.axis, "': ", send_rows.size(), " send and ",
           recv_rows.size(), " receive counts for a row of ", g.size,
           " ranks; give one count per rank (rows ", rows.sizes(), ")");
  int64_t sent = 0, received_rows = 0;
  for (std::size_t s = 0; s < n; ++s) {
    TE_CHECK(send_rows[s] >= 0 && recv_rows[s] >= 0, "all_to_all_rows over mesh axis '", g.axis,
             "': negative count for row rank ", s);
    sent += send_rows[s];
    received_rows += recv_rows[s];
  }
  TE_CHECK(sent == rows.size(0), "all_to_all_rows over mesh axis '", g.axis, "': the send counts",
           " add up to ", sent, " rows, but ", rows.size(0), " are given");
  // Ranks exchange different row counts, so the call is described by its trailing shape only.
  check_same_call(g, describe("all_to_all_rows", rows.narrow(0, 0, 0)), rows);
  std::vector<int64_t> shape(rows.sizes().begin(), rows.sizes().end());
  shape[0] = received_rows;
  if (g.size == 1) return rows.clone();
  const int64_t row_bytes =
      numel_of({shape.begin() + 1, shape.end()}) * static_cast<int64_t>(rows.element_size());
  Backend& backend = backend_for(g, rows);
  // Every piece carries kPad bytes beyond its rows, so that no buffer or piece is empty whatever
  // the counts (a rank that sends or receives no row: Gloo's split sizes divide by a buffer's
  // rows).
  constexpr int64_t kPad = 8;
  const at::Tensor bytes = as_bytes(rows);
  const at::Tensor pad = at::zeros({kPad}, bytes.options());
  std::vector<at::Tensor> pieces;
  std::vector<int64_t> in_sizes, out_sizes;
  int64_t offset = 0;
  for (std::size_t s = 0; s < n; ++s) {
    pieces.push_back(bytes.narrow(0, offset, send_rows[s] * row_bytes));
    pieces.push_back(pad);
    offset += send_rows[s] * row_bytes;
    in_sizes.push_back(send_rows[s] * row_bytes + kPad);
    out_sizes.push_back(recv_rows[s] * row_bytes + kPad);
  }
  const at::Tensor in = at::cat(pieces);
  at::Tensor received = at::empty({received_rows * row_bytes + kPad * g.size}, in.options());
  const char* primitive = run(
      g, "all_to_all_rows", [&] { return backend.all_to_all(in, received, in_sizes, out_sizes); });
  std::vector<at::Tensor> got;
  offset = 0;
  for (std::size_t s = 0; s < n; ++s) {
    got.push_back(received.narrow(0, offset, recv_rows[s] * row_bytes));
    offset += recv_rows[s] * row_bytes + kPad;
  }
  received = at::cat(got);
  CommTrace::record({Collective::kAllToAll, g.axis, bytes_of(rows), primitive});
  return from_bytes(received, rows.scalar_type(), shape);
}

at::Tensor ring_shift(const Group& g, const at::Tensor& t, int64_t shift, at::Tensor out) {
  TE_CHECK(!out.defined() || (out.sizes() == t.sizes() && out.scalar_type() == t.scalar_type() &&
                              out.device() == t.device() && out.is_contiguous()),
           "ring_shift over mesh axis '", g.axis, "': the buffer to receive into (",
           out.defined() ? out.sizes() : t.sizes(),
           ") must be contiguous and of the sent tensor's shape, dtype and device (", t.sizes(),
           ", ", t.scalar_type(), ")");
  check_same_call(g, describe("ring_shift(" + std::to_string(shift) + ")", t), t);
  const int64_t step = ((shift % g.size) + g.size) % g.size;
  if (g.size == 1 || step == 0) return out.defined() ? out.copy_(t) : t.clone();
  Backend& backend = backend_for(g, t);
  const int to = static_cast<int>((g.rank + step) % g.size);
  const int from = static_cast<int>((g.rank - step + g.size) % g.size);
  const at::Tensor in = as_bytes(t);
  at::Tensor received = out.defined() ? out.view({-1}).view(at::kByte) : at::empty_like(in);
  const char* primitive = run(g, "ring_shift", [&] {
    return backend.send_recv(in, to, received, from, static_cast<int>(g.size));
  });
  CommTrace::record({Collective::kSendRecv, g.axis, bytes_of(t), primitive});
  return out.defined() ? out : from_bytes(received, t.scalar_type(), t.sizes());
}

}  // namespace te::detail
