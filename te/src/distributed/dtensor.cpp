#include "te/distributed/dtensor.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <sstream>

#include "internal.h"
#include "redistribute.h"
#include "te/error.h"

namespace te {

namespace {

// Partial values of different reduce ops on two mesh dims: max and min do not commute with sum,
// so the value would depend on which mesh dim is reduced first. Refused as torch refuses them
// (torch 2.11, distributed/tensor/_utils.py assert_no_mixed_partial_types, L483: sum with avg is
// the one mix allowed, since those two commute), in from_local, distribute and redistribute.
void check_no_mixed_partials(const std::vector<Placement>& placements, const char* who) {
  std::vector<ReduceOp> ops;
  for (const Placement& p : placements) {
    if (!is_partial(p)) continue;
    const ReduceOp op = std::get<Partial>(p).op;
    if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
  }
  const bool sum_and_avg = ops.size() == 2 &&
                           std::find(ops.begin(), ops.end(), ReduceOp::kSum) != ops.end() &&
                           std::find(ops.begin(), ops.end(), ReduceOp::kAvg) != ops.end();
  if (ops.size() < 2 || sum_and_avg) return;
  std::string names;
  for (ReduceOp op : ops) names += (names.empty() ? "" : ", ") + to_string(op);
  TE_FAIL(who, ": placements ", to_string(placements), " mix Partial reduce ops (", names,
          "); only sum with avg commute, any other mix would give a value that depends on which "
          "mesh dim is reduced first: use one reduce op on every mesh dim (as torch's DTensor "
          "requires)");
}

// Checks placements against the mesh and tensor rank; returns them with Shard dims made
// non-negative.
std::vector<Placement> normalized(std::vector<Placement> placements, const DeviceMesh& mesh,
                                  int64_t ndim, const char* who) {
  TE_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(), who, ": ", placements.size(),
           " placements ", to_string(placements), " for ", mesh.to_string(),
           "; give one placement per mesh dim");
  check_no_mixed_partials(placements, who);
  for (std::size_t i = 0; i < placements.size(); ++i) {
    if (auto* s = std::get_if<Shard>(&placements[i])) {
      const int64_t dim = s->dim < 0 ? s->dim + ndim : s->dim;
      TE_CHECK(dim >= 0 && dim < ndim, who, ": ", to_string(placements[i]), " on mesh axis '",
               mesh.axis_names()[i], "' names dim ", s->dim, " of a ", ndim,
               "-dim tensor; shard a dim in [", -ndim, ", ", ndim, ")");
      s->dim = dim;
    }
  }
  return placements;
}

std::vector<Placement> all_replicate(const DeviceMesh& mesh) {
  return std::vector<Placement>(static_cast<std::size_t>(mesh.ndim()), Replicate{});
}

}  // namespace

std::vector<Chunk> local_chunks(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh,
                                const std::vector<Placement>& placements, int64_t rank) {
  const std::vector<int64_t> coords = mesh.coordinates_of(rank);
  std::vector<Chunk> chunks;
  for (int64_t size : global_shape) chunks.push_back({0, size});
  for (std::size_t i = 0; i < placements.size(); ++i) {
    if (const auto* s = std::get_if<Shard>(&placements[i])) {
      Chunk& c = chunks[static_cast<std::size_t>(s->dim)];
      const Chunk part = chunk_of(c.length, mesh.size(static_cast<int64_t>(i)), coords[i]);
      c = {c.offset + part.offset, part.length};
    }
  }
  return chunks;
}

DTensor::DTensor(at::Tensor local, DeviceMesh mesh, std::vector<Placement> placements,
                 std::vector<int64_t> global_shape)
    : local_(std::move(local)),
      mesh_(std::move(mesh)),
      placements_(std::move(placements)),
      global_shape_(std::move(global_shape)) {}

const DeviceMesh& DTensor::mesh() const {
  TE_CHECK(mesh_.has_value(),
           "this DTensor is empty (default-constructed); create one with "
           "DTensor::distribute or DTensor::from_local");
  return *mesh_;
}

int64_t DTensor::size(int64_t dim) const {
  const int64_t n = this->dim();
  const int64_t d = dim < 0 ? dim + n : dim;
  TE_CHECK(d >= 0 && d < n, "DTensor::size(", dim, ") of a ", n, "-dim tensor");
  return global_shape_[static_cast<std::size_t>(d)];
}

DTensor DTensor::distribute(const at::Tensor& global, const DeviceMesh& mesh,
                            std::vector<Placement> placements) {
  placements = normalized(std::move(placements), mesh, global.dim(), "DTensor::distribute");
  for (std::size_t i = 0; i < placements.size(); ++i) {
    TE_CHECK(!is_partial(placements[i]), "DTensor::distribute: ", te::to_string(placements[i]),
             " on mesh axis '", mesh.axis_names()[i],
             "': a whole tensor cannot be split into partial values; use Replicate() or "
             "Shard(d), or DTensor::from_local for values that are partial by computation");
  }
  const std::vector<int64_t> shape(global.sizes().begin(), global.sizes().end());
  const auto chunks = local_chunks(shape, mesh, placements, mesh.rank());
  at::Tensor local = global;
  for (std::size_t d = 0; d < chunks.size(); ++d) {
    if (chunks[d].length != shape[d]) {
      local = local.narrow(static_cast<int64_t>(d), chunks[d].offset, chunks[d].length);
    }
  }
  return DTensor(local.clone(), mesh, std::move(placements), shape);
}

DTensor DTensor::from_local(const at::Tensor& local, const DeviceMesh& mesh,
                            std::vector<Placement> placements,
                            std::optional<std::vector<int64_t>> global_shape) {
  placements = normalized(std::move(placements), mesh, local.dim(), "DTensor::from_local");
  std::vector<int64_t> shape;
  if (global_shape) {
    shape = *global_shape;
    TE_CHECK(static_cast<int64_t>(shape.size()) == local.dim(),
             "DTensor::from_local: global "
             "shape ",
             shape_text(shape), " has ", shape.size(), " dims but the local tensor ", local.dim());
    const auto chunks = local_chunks(shape, mesh, placements, mesh.rank());
    for (std::size_t d = 0; d < chunks.size(); ++d) {
      TE_CHECK(local.size(static_cast<int64_t>(d)) == chunks[d].length,
               "DTensor::from_local: rank ", mesh.rank(), " holds ",
               local.size(static_cast<int64_t>(d)), " of dim ", d,
               " but its torch.chunk piece of a global ", shape_text(shape), " under ",
               te::to_string(placements), " on ", mesh.to_string(), " is ", chunks[d].length,
               "; pass the right global_shape or local piece");
    }
  } else {
    shape.assign(local.sizes().begin(), local.sizes().end());
    for (std::size_t i = 0; i < placements.size(); ++i) {
      if (const auto* s = std::get_if<Shard>(&placements[i])) {
        shape[static_cast<std::size_t>(s->dim)] *= mesh.size(static_cast<int64_t>(i));
      }
    }
  }
  return DTensor(local, mesh, std::move(placements), std::move(shape));
}

struct DTensor::Origin {
  at::Tensor local;
  std::vector<Placement> placements;
};

at::Tensor DTensor::to_local(const std::vector<Placement>& grad_placements) const {
  if (origin_ == nullptr || !at::GradMode::is_enabled()) {
    return redistribute(placements_, grad_placements).to_local();
  }
  // Straight from redistribute: one node from its source to this data, whose backward takes
  // the declared gradients to the source's layout in one move.
  detail::RelayoutSpec spec;
  spec.global_shape = global_shape_;
  spec.mesh = mesh();
  spec.src = origin_->placements;
  spec.dst = placements_;
  spec.grad_in = normalized(grad_placements, mesh(), dim(), "DTensor::to_local (gradients)");
  spec.done = local_;
  return detail::relayout(origin_->local, std::move(spec));
}

at::Tensor DTensor::full_tensor() const {
  return detail::relayout(local_, {global_shape_, mesh(), placements_, all_replicate(mesh())});
}

DTensor DTensor::redistribute(std::vector<Placement> placements) const {
  check_no_mixed_partials(placements_, "DTensor::redistribute (the tensor's own placements)");
  placements = normalized(std::move(placements), mesh(), dim(), "DTensor::redistribute");
  at::Tensor local = detail::relayout(local_, {global_shape_, mesh(), placements_, placements});
  DTensor out(std::move(local), mesh(), std::move(placements), global_shape_);
  if (at::GradMode::is_enabled() && local_.requires_grad()) {
    out.origin_ = std::make_shared<const Origin>(Origin{local_, placements_});
  }
  return out;
}

DTensor DTensor::redistribute(std::vector<Placement> placements,
                              std::vector<Placement> grad_placements) const {
  detail::RelayoutSpec spec;
  spec.global_shape = global_shape_;
  spec.mesh = mesh();
  spec.src = placements_;
  spec.dst = normalized(std::move(placements), mesh(), dim(), "DTensor::redistribute");
  spec.grad_in =
      normalized(std::move(grad_placements), mesh(), dim(), "DTensor::redistribute (gradients)");
  detail::check_reachable(spec.src, spec.dst);  // report a bad target before running
  std::vector<Placement> dst = spec.dst;
  at::Tensor local = detail::relayout(local_, std::move(spec));
  return DTensor(std::move(local), mesh(), std::move(dst), global_shape_);
}

std::string DTensor::to_string() const {
  if (!defined()) return "DTensor()";
  return "DTensor(sizes=" + shape_text(global_shape_) + ", mesh=" + mesh().to_string() +
         ", placements=" + te::to_string(placements_) + ")";
}

// ---------------------------------------------------------------------------------------------

std::vector<Placement> placements_for(const PartitionSpec& spec, const DeviceMesh& mesh) {
  std::vector<Placement> placements = all_replicate(mesh);
  for (std::size_t d = 0; d < spec.dims.size(); ++d) {
    int64_t previous = -1;
    for (const std::string& axis : spec.dims[d]) {
      TE_CHECK(mesh.has_axis(axis), to_string(spec), " shards dim ", d, " over mesh axis '", axis,
               "', which ", mesh.to_string(),
               " does not have; rename the mesh axis in your rules or MeshResource");
      const int64_t i = mesh.axis_index(axis);
      TE_CHECK(is_replicate(placements[static_cast<std::size_t>(i)]), to_string(spec),
               " uses mesh axis '", axis, "' for two dims; a mesh axis shards one dim at most");
      TE_CHECK(i > previous, to_string(spec), " shards dim ", d,
               " over mesh axes out of the mesh's order (", mesh.to_string(),
               "); list them major to minor as the mesh does");
      previous = i;
      placements[static_cast<std::size_t>(i)] = Shard{static_cast<int64_t>(d)};
    }
  }
  return placements;
}

std::optional<std::vector<Placement>> resolve_placements(const LogicalAxes& axes,
                                                         const DeviceMesh& mesh,
                                                         RulesFallback fallback) {
  const MeshShapeScope sizes(MeshShape{mesh.shape(), mesh.axis_names()});  // TE's table reads them
  const std::optional<PartitionSpec> spec = resolve_logical_axes(axes, fallback);
  if (!spec) return std::nullopt;
  return placements_for(*spec, mesh);
}

DTensor with_sharding_constraint(const DTensor& x, const LogicalAxes& axes,
                                 RulesFallback fallback) {
  ConstraintOptions options;
  options.fallback = fallback;
  return with_sharding_constraint(x, axes, options);
}

DTensor with_sharding_constraint(const DTensor& x, const LogicalAxes& axes,
                                 const ConstraintOptions& options) {
  TE_CHECK(static_cast<int64_t>(axes.size()) == x.dim(), "with_sharding_constraint: ", axes.size(),
           " logical axes ", to_string(axes), " for a ", x.dim(), "-dim tensor ", x.to_string(),
           "; give one name (or std::nullopt) per dim");
  const DeviceMesh* mesh = current_mesh();
  if (mesh == nullptr) {
    validate_logical_axes(axes);
    return x;
  }
  TE_CHECK(x.mesh() == *mesh, "with_sharding_constraint: the tensor lives on ",
           x.mesh().to_string(), " but the current mesh is another (", mesh->to_string(),
           x.mesh().to_string() == mesh->to_string()
               ? ", the same shape but a separate DeviceMesh with process groups of its own"
               : "",
           "); redistribute within one mesh, or open a MeshScope of the tensor's mesh");
  const std::optional<PartitionSpec> spec = resolve_logical_axes(axes, options.fallback);
  if (!spec) return x;
  if (options.require_even) {
    for (std::size_t d = 0; d < spec->dims.size(); ++d) {
      int64_t parts = 1;
      for (const std::string& a : spec->dims[d]) parts *= mesh->size(a);
      TE_CHECK(x.size(static_cast<int64_t>(d)) % parts == 0, "with_sharding_constraint: dim ", d,
               " ('", axes[d].value_or("?"), "') has size ", x.size(static_cast<int64_t>(d)),
               ", which ", to_string(*spec), " splits ", parts,
               " ways unevenly; make it a multiple of ", parts,
               " or drop require_even for torch.chunk pieces");
    }
  }
  return x.redistribute(placements_for(*spec, *mesh));
}

at::Tensor with_sharding_constraint(const at::Tensor& x, const LogicalAxes& axes,
                                    RulesFallback fallback) {
  TE_CHECK(static_cast<int64_t>(axes.size()) == x.dim(), "with_sharding_constraint: ", axes.size(),
           " logical axes ", to_string(axes), " for a ", x.dim(),
           "-dim tensor; give one name (or std::nullopt) per dim");
  const std::optional<PartitionSpec> spec = resolve_logical_axes(axes, fallback);
  const DeviceMesh* mesh = current_mesh();
  if (spec && mesh != nullptr && mesh->size() > 1 && !spec->is_replicated()) {
    placements_for(*spec, *mesh);  // an unknown mesh axis is reported as such
    TE_FAIL("with_sharding_constraint: a plain at::Tensor has no layout, but the constraint ",
            to_string(axes), " asks for ", to_string(*spec), " on ", mesh->to_string(),
            "; wrap it with DTensor::distribute (the same tensor on every rank) or "
            "DTensor::from_local (this rank's piece)");
  }
  return x;
}

std::string visualize_sharding(const DTensor& x) {
  const DeviceMesh& mesh = x.mesh();
  std::ostringstream os;
  os << x.to_string() << "\n";
  std::string partial;
  for (std::size_t i = 0; i < x.placements().size(); ++i) {
    if (const auto* p = std::get_if<Partial>(&x.placements()[i])) {
      partial += " partial(" + to_string(p->op) + ") over '" + mesh.axis_names()[i] + "'";
    }
  }
  for (int64_t r = 0; r < mesh.size(); ++r) {
    const auto coords = mesh.coordinates_of(r);
    os << "rank " << r << " (";
    for (std::size_t i = 0; i < coords.size(); ++i) {
      os << (i ? ", " : "") << mesh.axis_names()[i] << "=" << coords[i];
    }
    os << "): [";
    bool empty = false;
    const auto chunks = local_chunks(x.sizes(), mesh, x.placements(), r);
    for (std::size_t d = 0; d < chunks.size(); ++d) {
      os << (d ? ", " : "") << chunks[d].offset << ":" << chunks[d].offset + chunks[d].length;
      empty = empty || chunks[d].length == 0;
    }
    os << "]" << partial << (empty ? " (empty)" : "") << "\n";
  }
  return os.str();
}

namespace detail {

std::shared_ptr<ThreadScopes> install_gradient_hook(GradientReductionHook* hook) {
  auto scopes = scopes_in_effect();
  std::lock_guard<std::mutex> lock(scopes->mutex);
  scopes->hooks.push(hook, hook);
  return scopes;
}

void remove_gradient_hook(ThreadScopes& scopes, GradientReductionHook* hook) {
  std::lock_guard<std::mutex> lock(scopes.mutex);
  scopes.hooks.pop(hook);
}

GradientReductionHook* current_gradient_hook() {
  const auto scopes = scopes_in_effect();
  std::lock_guard<std::mutex> lock(scopes->mutex);
  return scopes->hooks.top_or(nullptr);
}

}  // namespace detail

}  // namespace te
