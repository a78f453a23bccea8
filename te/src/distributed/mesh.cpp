#include "te/distributed/mesh.h"

#include <algorithm>
#include <cstring>
#include <numeric>

#include "internal.h"
#include "te/error.h"
#include "te/scope_stack.h"

namespace te {

namespace {

std::string list_axes(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

// "DeviceMesh(data=2, model=2)".
std::string mesh_text(const std::vector<int64_t>& shape, const std::vector<std::string>& names) {
  std::string out = "DeviceMesh(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    out += (i ? ", " : "") + names[i] + "=" + std::to_string(shape[i]);
  }
  return out + ")";
}

// World ranks of the row through `rank` along mesh dim `dim` (row-major layout).
std::vector<int64_t> row_ranks(const std::vector<int64_t>& shape,
                               const std::vector<int64_t>& coords, int64_t rank, int64_t dim) {
  int64_t stride = 1;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d > dim; --d) stride *= shape[d];
  const int64_t base = rank - coords[dim] * stride;
  std::vector<int64_t> ranks;
  for (int64_t i = 0; i < shape[dim]; ++i) ranks.push_back(base + i * stride);
  return ranks;
}

// The meshes in force on this thread (te/scope_stack.h); a null one masks the outer ones.
ScopeStack<const DeviceMesh*>& mesh_stack() {
  thread_local ScopeStack<const DeviceMesh*> stack;
  return stack;
}

}  // namespace

namespace {

// A mesh's shape and axis names, checked on their own.
void check_mesh_axes(const std::vector<int64_t>& shape,
                     const std::vector<std::string>& axis_names) {
  TE_CHECK(!shape.empty(),
           "DeviceMesh: the shape is empty; give at least one axis, e.g. "
           "DeviceMesh({world_size()}, {\"data\"})");
  TE_CHECK(shape.size() == axis_names.size(), "DeviceMesh: ", shape.size(), " sizes but ",
           axis_names.size(), " axis names; give one name per mesh axis");
  for (std::size_t i = 0; i < shape.size(); ++i) {
    TE_CHECK(shape[i] >= 1, "DeviceMesh: axis '", axis_names[i], "' has size ", shape[i],
             "; every axis needs at least one rank");
    TE_CHECK(!axis_names[i].empty(), "DeviceMesh: axis ", i, " has an empty name");
    for (std::size_t j = 0; j < i; ++j) {
      TE_CHECK(axis_names[i] != axis_names[j], "DeviceMesh: axis name '", axis_names[i],
               "' is used twice; name each mesh axis once");
    }
  }
}

// Every rank must build the same meshes in the same order; one that does not would wait on
// rows nobody else joins. The descriptions are compared first, so every rank names the
// difference at once.
void check_same_mesh_on_every_rank(detail::World& world, int64_t mesh_id,
                                   const std::vector<int64_t>& shape,
                                   const std::vector<std::string>& axis_names) {
  const std::string mine = mesh_text(shape, axis_names);
  const std::string topic = "mesh_desc/" + std::to_string(mesh_id);
  const std::vector<std::string> all = world.exchange(
      topic, mine, "DeviceMesh #" + std::to_string(mesh_id) + " (this rank built " + mine + ")");
  std::vector<std::pair<std::string, std::string>> kinds;  // (description, its ranks)
  for (std::size_t r = 0; r < all.size(); ++r) {
    auto it =
        std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == all[r]; });
    if (it == kinds.end()) it = kinds.insert(kinds.end(), {all[r], std::string()});
    it->second += (it->second.empty() ? "" : ", ") + std::to_string(r);
  }
  if (kinds.size() > 1) {
    world.linger(topic);
    std::string differ;
    for (const auto& [description, ranks] : kinds) {
      differ +=
          (differ.empty() ? "" : "; ") + std::string("rank(s) ") + ranks + " built " + description;
    }
    TE_FAIL("DeviceMesh #", mesh_id, " differs between ranks: ", differ,
            "; every rank must construct the same meshes (shape and axis names) in the same "
            "order");
  }
}

}  // namespace

DeviceMesh::DeviceMesh(std::vector<int64_t> shape, std::vector<std::string> axis_names,
                       std::optional<CollectiveAlgorithms> algorithms) {
  check_mesh_axes(shape, axis_names);
  auto state = std::make_shared<detail::MeshState>();
  state->world = detail::current_world();
  const int64_t world = state->world ? state->world->size() : 1;
  const int64_t mesh_id = state->world ? state->world->next_mesh_id() : 0;
  if (world > 1) check_same_mesh_on_every_rank(*state->world, mesh_id, shape, axis_names);
  const int64_t product =
      std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
  TE_CHECK(product == world, "DeviceMesh: the mesh (", list_axes(axis_names), ") has ", product,
           " ranks but the world has ", world,
           "; make the product of the mesh shape equal world_size()");
  state->shape = std::move(shape);
  state->names = std::move(axis_names);
  state->rank = state->world ? state->world->rank() : 0;
  state->coords = std::vector<int64_t>(state->shape.size());
  int64_t rest = state->rank;
  for (int64_t d = static_cast<int64_t>(state->shape.size()) - 1; d >= 0; --d) {
    state->coords[d] = rest % state->shape[d];
    rest /= state->shape[d];
  }
  // One process group per row of each axis. Every rank walks the dims in the same order and
  // bumps the same counter, so the rendezvous keys agree; only a row's members connect.
  state->id = mesh_id;
  state->groups.resize(state->shape.size());
  for (std::size_t d = 0; d < state->shape.size(); ++d) {
    detail::Group& g = state->groups[d];
    g.size = state->shape[d];
    g.rank = state->coords[d];
    g.axis = state->names[d];
    g.ranks = row_ranks(state->shape, state->coords, state->rank, static_cast<int64_t>(d));
    g.world_rank = state->rank;
    if (state->world) {
      g.timeout = state->world->options().timeout;
      g.algorithms = state->world->options().algorithms;
    }
    if (algorithms) g.algorithms = *algorithms;
    g.world = state->world.get();
    if (g.size > 1) {
      g.comm = std::make_shared<detail::RowComm>(
          state->world.get(), "mesh" + std::to_string(mesh_id) + "/" + state->names[d], g.ranks,
          g.algorithms);
    }
  }
  state_ = std::move(state);
}

int64_t DeviceMesh::ndim() const { return static_cast<int64_t>(state_->shape.size()); }
int64_t DeviceMesh::size() const {
  return std::accumulate(state_->shape.begin(), state_->shape.end(), int64_t{1},
                         std::multiplies<int64_t>());
}
int64_t DeviceMesh::size(const std::string& axis) const { return size(axis_index(axis)); }
int64_t DeviceMesh::size(int64_t dim) const {
  TE_CHECK(dim >= 0 && dim < ndim(), to_string(), " has no dim ", dim);
  return state_->shape[static_cast<std::size_t>(dim)];
}
const std::vector<int64_t>& DeviceMesh::shape() const { return state_->shape; }
const std::vector<std::string>& DeviceMesh::axis_names() const { return state_->names; }

int64_t DeviceMesh::axis_index(const std::string& axis) const {
  const auto& names = state_->names;
  const auto it = std::find(names.begin(), names.end(), axis);
  TE_CHECK(it != names.end(), "mesh axis '", axis, "' is not in ", to_string(), "; its axes are ",
           list_axes(names));
  return static_cast<int64_t>(it - names.begin());
}

at::Tensor DeviceMesh::all_reduce(const at::Tensor& t, ReduceOp op,
                                  const std::vector<int64_t>& dims) const {
  for (int64_t d : dims) {
    TE_CHECK(d >= 0 && d < ndim(), to_string(), " has no dim ", d, " to reduce over");
  }
  if (dims.empty()) return t.clone();
  return detail::all_reduce(detail::group_over(*state_, dims), t, op);
}

at::Tensor DeviceMesh::ring_shift(const at::Tensor& t, int64_t dim, int64_t shift,
                                  at::Tensor out) const {
  TE_CHECK(dim >= 0 && dim < ndim(), to_string(), " has no dim ", dim, " to pass a ring along");
  return detail::ring_shift(state_->groups.at(static_cast<std::size_t>(dim)), t, shift,
                            std::move(out));
}

at::Tensor DeviceMesh::all_to_all_rows(const at::Tensor& rows, int64_t dim,
                                       const std::vector<int64_t>& send_rows,
                                       const std::vector<int64_t>& recv_rows) const {
  TE_CHECK(dim >= 0 && dim < ndim(), to_string(), " has no dim ", dim, " to exchange rows along");
  return detail::all_to_all_rows(state_->groups.at(static_cast<std::size_t>(dim)), rows, send_rows,
                                 recv_rows);
}

namespace {

// Every mesh dim, for the collectives over the whole mesh.
std::vector<int64_t> all_dims(const DeviceMesh& mesh) {
  std::vector<int64_t> dims(static_cast<std::size_t>(mesh.ndim()));
  std::iota(dims.begin(), dims.end(), int64_t{0});
  return dims;
}

// Where a mesh's own collectives of bytes run: on the CPU when the world's backend moves CPU
// tensors (no GPU communicator made for them, and any number of ranks per GPU host), else on
// this rank's device.
c10::Device bytes_device(const detail::MeshState& state) {
  const std::string name = state.world ? state.world->options().backend : "auto";
  const bool cpu =
      name == "auto"
          ? comm::auto_backend(c10::kCPU).has_value()
          : comm::find_backend(name, "DistributedOptions::backend").carries_type(c10::kCPU);
  return cpu ? c10::Device(c10::kCPU) : local_device();
}

}  // namespace

std::vector<std::string> DeviceMesh::all_gather(const std::string& mine) const {
  return all_gather(mine, all_dims(*this));
}

std::vector<std::string> DeviceMesh::all_gather(const std::string& mine,
                                                const std::vector<int64_t>& dims) const {
  int64_t n = 1;
  for (std::size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = dims[i];
    TE_CHECK(d >= 0 && d < ndim(), to_string(), " has no dim ", d, " to gather over");
    TE_CHECK(std::find(dims.begin(), dims.begin() + static_cast<std::ptrdiff_t>(i), d) ==
                 dims.begin() + static_cast<std::ptrdiff_t>(i),
             to_string(), ": all_gather over dim ", d, " twice; name each mesh dim once");
    n *= size(d);
  }
  if (n == 1) return {mine};
  const detail::Group& g = detail::group_over(*state_, dims);
  // Lengths first, then the bytes padded to the longest.
  const auto on = at::TensorOptions().device(bytes_device(*state_));
  const at::Tensor lengths =
      detail::all_gather(g, at::full({1}, static_cast<int64_t>(mine.size()), on.dtype(at::kLong)),
                         0, n)
          .cpu();
  const int64_t longest = lengths.max().item<int64_t>();
  at::Tensor bytes = at::zeros({longest}, at::kByte);
  if (!mine.empty()) std::memcpy(bytes.data_ptr<uint8_t>(), mine.data(), mine.size());
  const at::Tensor all = detail::all_gather(g, bytes.to(on.device()), 0, n * longest).cpu();
  std::vector<std::string> out;
  for (int64_t r = 0; r < n; ++r) {
    const auto* p = all.data_ptr<uint8_t>() + r * longest;
    out.emplace_back(reinterpret_cast<const char*>(p),
                     static_cast<std::size_t>(lengths[r].item<int64_t>()));
  }
  return out;
}

std::string DeviceMesh::broadcast(const std::string& bytes, int64_t root) const {
  const int64_t n = size();
  TE_CHECK(root >= 0 && root < n, "DeviceMesh::broadcast: root ", root, " is not a rank of ",
           to_string(), " (ranks 0..", n - 1, ")");
  if (n == 1) return bytes;
  // A sum to which only the root contributes: Gloo's and NCCL's all-reduce move n bytes where an
  // all-gather moves n times the longest (DESIGN.md §4: Gloo's all-gather is the slow one).
  const detail::Group& g = detail::group_over(*state_, all_dims(*this));
  const auto on = at::TensorOptions().device(bytes_device(*state_));
  const bool is_root = rank() == root;
  const int64_t length =
      detail::all_reduce(
          g, at::full({1}, is_root ? static_cast<int64_t>(bytes.size()) : 0, on.dtype(at::kLong)),
          ReduceOp::kSum)
          .cpu()
          .item<int64_t>();
  if (length == 0) return {};
  at::Tensor data = at::zeros({length}, at::kByte);
  if (is_root) std::memcpy(data.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  data = detail::all_reduce(g, data.to(on.device()), ReduceOp::kSum).cpu().contiguous();
  return std::string(reinterpret_cast<const char*>(data.data_ptr<uint8_t>()),
                     static_cast<std::size_t>(length));
}

void DeviceMesh::barrier() const {
  if (size() == 1) return;
  detail::all_reduce(detail::group_over(*state_, all_dims(*this)),
                     at::zeros({1}, at::TensorOptions().device(bytes_device(*state_))),
                     ReduceOp::kSum);
}

bool DeviceMesh::has_axis(const std::string& axis) const {
  return std::find(state_->names.begin(), state_->names.end(), axis) != state_->names.end();
}

int64_t DeviceMesh::rank() const { return state_->rank; }
int64_t DeviceMesh::coordinate(const std::string& axis) const {
  return coordinate(axis_index(axis));
}
int64_t DeviceMesh::coordinate(int64_t dim) const {
  TE_CHECK(dim >= 0 && dim < ndim(), to_string(), " has no dim ", dim);
  return state_->coords[static_cast<std::size_t>(dim)];
}

std::vector<int64_t> DeviceMesh::coordinates_of(int64_t rank) const {
  TE_CHECK(rank >= 0 && rank < size(), to_string(), " has no rank ", rank);
  std::vector<int64_t> coords(state_->shape.size());
  for (int64_t d = ndim() - 1; d >= 0; --d) {
    coords[d] = rank % state_->shape[d];
    rank /= state_->shape[d];
  }
  return coords;
}

std::vector<int64_t> DeviceMesh::group_ranks(int64_t dim) const {
  TE_CHECK(dim >= 0 && dim < ndim(), to_string(), " has no dim ", dim);
  return row_ranks(state_->shape, state_->coords, state_->rank, dim);
}

std::string DeviceMesh::to_string() const { return mesh_text(state_->shape, state_->names); }

MeshScope::MeshScope(const DeviceMesh& mesh)
    : mesh_(mesh), shape_(MeshShape{mesh.shape(), mesh.axis_names()}) {
  mesh_stack().push(this, &mesh_);
}

MeshScope::~MeshScope() { mesh_stack().pop(this); }

const DeviceMesh* current_mesh() { return mesh_stack().top_or(nullptr); }

DistributedContext capture_distributed_context() {
  DistributedContext context;
  context.sharding = capture_sharding_context();
  if (const DeviceMesh* mesh = current_mesh()) context.mesh = *mesh;
  context.world = detail::current_world();
  return context;
}

DistributedContextScope::DistributedContextScope(const DistributedContext& context)
    : sharding_(context.sharding) {
  detail::push_thread_world(this, context.world);
  if (context.mesh) {
    mesh_.emplace(*context.mesh);
  } else {
    mesh_stack().push(this, nullptr);  // no mesh there: none here either
  }
}

DistributedContextScope::~DistributedContextScope() {
  if (mesh_) {
    mesh_.reset();
  } else {
    mesh_stack().pop(this);
  }
  detail::pop_thread_world(this);
}

namespace detail {

const Group& group_over(const MeshState& mesh, const std::vector<int64_t>& dims) {
  if (dims.size() == 1) return mesh.groups.at(static_cast<std::size_t>(dims[0]));
  std::lock_guard<std::mutex> lock(mesh.flat_mutex);
  auto& slot = mesh.flat_groups[dims];
  if (slot) return *slot;
  auto g = std::make_shared<Group>();
  // The sub-grid through this rank: every combination of coordinates on `dims`, the others
  // fixed at this rank's, in row-major order of `dims`.
  std::vector<int64_t> strides(mesh.shape.size(), 1);
  for (int64_t d = static_cast<int64_t>(mesh.shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * mesh.shape[d + 1];
  }
  int64_t base = mesh.rank;
  for (int64_t d : dims) base -= mesh.coords[d] * strides[d];
  g->ranks = {base};
  g->rank = 0;
  for (int64_t d : dims) {
    std::vector<int64_t> next;
    for (int64_t r : g->ranks) {
      for (int64_t i = 0; i < mesh.shape[d]; ++i) next.push_back(r + i * strides[d]);
    }
    g->ranks = std::move(next);
    g->rank = g->rank * mesh.shape[d] + mesh.coords[d];
  }
  g->size = static_cast<int64_t>(g->ranks.size());
  for (int64_t d : dims) g->axis += (g->axis.empty() ? "" : "+") + mesh.names[d];
  g->world_rank = mesh.rank;
  const Group& first = mesh.groups.at(static_cast<std::size_t>(dims.empty() ? 0 : dims[0]));
  g->timeout = first.timeout;
  g->algorithms = first.algorithms;
  g->world = mesh.world.get();
  if (g->size > 1) {
    g->comm = std::make_shared<RowComm>(mesh.world.get(),
                                        "mesh" + std::to_string(mesh.id) + "/" + g->axis, g->ranks,
                                        g->algorithms);
  }
  slot = std::move(g);
  return *slot;
}

}  // namespace detail
}  // namespace te
