// Redistribute (docs/ARCHITECTURE.md §3): the moves a plan is made of, each one row of a table
// holding what it leaves on its mesh dim, its forward and its backward; the planner that picks
// them; and the one autograd function that runs a plan. Adding a placement-level move is adding
// a row to the table and teaching the planner when to use it, both in this file.

#include "redistribute.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <iterator>

#include "internal.h"
#include "te/distributed/scopes.h"
#include "te/error.h"

namespace te::detail {

namespace {

// ---- the moves -------------------------------------------------------------------------------

enum class MoveKind {
  kGather,         ///< Shard(dim) -> Replicate: all-gather
  kSlice,          ///< Replicate -> Shard(dim): keep this rank's chunk, no communication
  kAllToAll,       ///< Shard(dim) -> Shard(dim2): all-to-all
  kReduce,         ///< Partial(op) -> Replicate: all-reduce
  kReduceScatter,  ///< Partial(op) -> Shard(dim): reduce-scatter (sum / avg)
};

/// One move of a plan, on one mesh dim.
struct Step {
  MoveKind kind;
  int64_t mesh_dim;
  int64_t dim;
  int64_t dim2;
  ReduceOp op;
};

/// A step as it runs on this rank: its row and the whole sizes of its dims within the row.
struct Run {
  Step step;
  const Group* group = nullptr;
  int64_t full = 0;   // whole size of step.dim in the row's context (gather / slice / scatter)
  int64_t full2 = 0;  // whole size of step.dim2 (all-to-all's target dim)
};

at::Tensor slice_chunk(const Group& g, const at::Tensor& t, int64_t dim) {
  const Chunk c = chunk_of(t.size(dim), g.size, g.rank);
  return t.narrow(dim, c.offset, c.length).clone();
}

struct Move {
  MoveKind kind;  ///< the row's own kind: move_of checks the table against it
  /// The placement the move leaves on its mesh dim.
  Placement (*produces)(const Step&);
  at::Tensor (*forward)(const Run&, const at::Tensor& x);
  /// Whether backward needs the forward's input and output.
  bool (*keeps_io)(const Step&);
  /// The gradient of the input from that of the output (x, y: the forward's input and output
  /// when keeps_io, else undefined).
  at::Tensor (*backward)(const Run&, const at::Tensor& grad, const at::Tensor& x,
                         const at::Tensor& y);
};

bool never(const Step&) { return false; }

const Move& move_of(MoveKind kind) {
  static const Move kMoves[] = {
      // Backward keeps this rank's chunk.
      {MoveKind::kGather, [](const Step&) -> Placement { return Replicate{}; },
       [](const Run& r, const at::Tensor& x) {
         return all_gather(*r.group, x, r.step.dim, r.full);
       },
       never,
       [](const Run& r, const at::Tensor& g, const at::Tensor&, const at::Tensor&) {
         return slice_chunk(*r.group, g, r.step.dim);
       }},
      // Backward gathers.
      {MoveKind::kSlice, [](const Step& s) -> Placement { return Shard{s.dim}; },
       [](const Run& r, const at::Tensor& x) { return slice_chunk(*r.group, x, r.step.dim); },
       never,
       [](const Run& r, const at::Tensor& g, const at::Tensor&, const at::Tensor&) {
         return all_gather(*r.group, g, r.step.dim, r.full);
       }},
      // Backward is the reverse all-to-all.
      {MoveKind::kAllToAll, [](const Step& s) -> Placement { return Shard{s.dim2}; },
       [](const Run& r, const at::Tensor& x) {
         return all_to_all(*r.group, x, r.step.dim, r.full, r.step.dim2);
       },
       never,
       [](const Run& r, const at::Tensor& g, const at::Tensor&, const at::Tensor&) {
         return all_to_all(*r.group, g, r.step.dim2, r.full2, r.step.dim);
       }},
      // Every holder gets the gradient (scaled for avg); for max / min, as for amax over a
      // stacked dim, the ranks holding the extreme value, split evenly among ties.
      {MoveKind::kReduce, [](const Step&) -> Placement { return Replicate{}; },
       [](const Run& r, const at::Tensor& x) { return all_reduce(*r.group, x, r.step.op); },
       [](const Step& s) { return s.op == ReduceOp::kMax || s.op == ReduceOp::kMin; },
       [](const Run& r, const at::Tensor& g, const at::Tensor& x, const at::Tensor& y) {
         switch (r.step.op) {
           case ReduceOp::kSum:
             return g.clone();
           case ReduceOp::kAvg:
             return g / static_cast<double>(r.group->size);
           case ReduceOp::kMax:
           case ReduceOp::kMin:
             break;
         }
         const at::Tensor mask = x.eq(y).to(g.scalar_type());
         return g * mask / all_reduce(*r.group, mask, ReduceOp::kSum);
       }},
      // Backward gathers (scaled for avg).
      {MoveKind::kReduceScatter, [](const Step& s) -> Placement { return Shard{s.dim}; },
       [](const Run& r, const at::Tensor& x) {
         return reduce_scatter(*r.group, x, r.step.op, r.step.dim);
       },
       never,
       [](const Run& r, const at::Tensor& g, const at::Tensor&, const at::Tensor&) {
         at::Tensor out = all_gather(*r.group, g, r.step.dim, r.full);
         return r.step.op == ReduceOp::kAvg ? out / static_cast<double>(r.group->size) : out;
       }},
  };
  // Rows are looked up by position; each names its kind, and a table out of order is caught on
  // first use rather than running another move.
  static const bool in_order = [] {
    for (std::size_t i = 0; i < std::size(kMoves); ++i) {
      TE_CHECK(static_cast<std::size_t>(kMoves[i].kind) == i,
               "internal: redistribute's move table row ", i, " is out of order");
    }
    return true;
  }();
  (void)in_order;
  return kMoves[static_cast<std::size_t>(kind)];
}

// ---- the planner -----------------------------------------------------------------------------

bool involves(const Placement& p, int64_t dim) { return is_shard(p, dim); }

// Does a mesh dim more major than `j` change in a way that touches tensor dim `dim`? Then the
// nesting order forces mesh dim j's Shard(dim) to be undone first and redone after.
bool major_change_touches(const std::vector<Placement>& src, const std::vector<Placement>& dst,
                          std::size_t j, int64_t dim) {
  for (std::size_t i = 0; i < j; ++i) {
    if (src[i] != dst[i] && (involves(src[i], dim) || involves(dst[i], dim))) return true;
  }
  return false;
}

std::vector<Step> plan_redistribute(const std::vector<Placement>& src,
                                    const std::vector<Placement>& dst) {
  TE_CHECK(src.size() == dst.size(), "internal: placements of different lengths");
  const std::size_t n = src.size();
  for (std::size_t j = 0; j < n; ++j) {
    if (is_partial(dst[j]) && src[j] != dst[j]) {
      TE_FAIL("redistribute to ", to_string(dst[j]), " on mesh dim ", j, " (from ",
              to_string(src[j]),
              ") is not possible: Partial values arise from computation (e.g. a local matmul "
              "over a sharded contraction dim), so create them with DTensor::from_local(..., "
              "{Partial()}) instead");
    }
  }
  std::vector<Placement> cur = src;
  std::vector<Step> steps;

  // A: undo shards, minor to major, so nested chunks of one tensor dim come apart in order.
  for (std::size_t jj = n; jj-- > 0;) {
    if (!is_shard(cur[jj])) continue;
    const int64_t d = std::get<Shard>(cur[jj]).dim;
    if (cur[jj] == dst[jj] && !major_change_touches(src, dst, jj, d)) continue;
    if (is_shard(dst[jj])) {
      const int64_t e = std::get<Shard>(dst[jj]).dim;
      bool alone = e != d;
      for (std::size_t k = 0; k < n && alone; ++k) {
        if (k == jj) continue;
        alone = !involves(src[k], d) && !involves(src[k], e) && !involves(dst[k], d) &&
                !involves(dst[k], e);
      }
      if (alone) {
        steps.push_back({MoveKind::kAllToAll, static_cast<int64_t>(jj), d, e, ReduceOp::kSum});
        cur[jj] = dst[jj];
        continue;
      }
    }
    steps.push_back({MoveKind::kGather, static_cast<int64_t>(jj), d, -1, ReduceOp::kSum});
    cur[jj] = Replicate{};
  }

  // B: reduce partial values, scattering straight into the target shard when order allows.
  for (std::size_t j = 0; j < n; ++j) {
    if (!is_partial(cur[j]) || cur[j] == dst[j]) continue;
    const ReduceOp op = std::get<Partial>(cur[j]).op;
    if (is_shard(dst[j]) && (op == ReduceOp::kSum || op == ReduceOp::kAvg)) {
      const int64_t e = std::get<Shard>(dst[j]).dim;
      bool majors_done = true;
      for (std::size_t i = 0; i < j; ++i) {
        if (is_shard(dst[i], e) && cur[i] != dst[i]) majors_done = false;
      }
      for (std::size_t k = j + 1; k < n; ++k) {
        if (involves(cur[k], e)) majors_done = false;
      }
      if (majors_done) {
        steps.push_back({MoveKind::kReduceScatter, static_cast<int64_t>(j), e, -1, op});
        cur[j] = dst[j];
        continue;
      }
    }
    steps.push_back({MoveKind::kReduce, static_cast<int64_t>(j), -1, -1, op});
    cur[j] = Replicate{};
  }

  // C: cut the target shards, major to minor (no communication).
  for (std::size_t i = 0; i < n; ++i) {
    if (cur[i] == dst[i]) continue;
    TE_CHECK(is_replicate(cur[i]) && is_shard(dst[i]), "internal: redistribute plan reached ",
             to_string(cur[i]), " -> ", to_string(dst[i]), " on mesh dim ", i);
    steps.push_back({MoveKind::kSlice, static_cast<int64_t>(i), std::get<Shard>(dst[i]).dim, -1,
                     ReduceOp::kSum});
    cur[i] = dst[i];
  }
  return steps;
}

// The plan as it runs on this rank: steps on rows of one rank are skipped (placements only).
std::vector<Run> runs_of(const std::vector<int64_t>& global_shape, const DeviceMesh& mesh,
                         const std::vector<Placement>& src, const std::vector<Placement>& dst) {
  std::vector<Run> runs;
  std::vector<Placement> cur = src;
  for (const Step& step : plan_redistribute(src, dst)) {
    const std::size_t j = static_cast<std::size_t>(step.mesh_dim);
    const Group& g = mesh.state().groups[j];
    if (g.size > 1) {
      Run r{step, &g};
      // The whole extent of a dim within this row: its size with this mesh dim replicated.
      std::vector<Placement> whole = cur;
      whole[j] = Replicate{};
      const auto chunks = local_chunks(global_shape, mesh, whole, mesh.rank());
      if (step.dim >= 0) r.full = chunks[static_cast<std::size_t>(step.dim)].length;
      if (step.dim2 >= 0) r.full2 = chunks[static_cast<std::size_t>(step.dim2)].length;
      runs.push_back(r);
    }
    cur[j] = move_of(step.kind).produces(step);
  }
  return runs;
}

// ---- the autograd function -------------------------------------------------------------------

struct RelayoutState : torch::CustomClassHolder {
  RelayoutSpec spec;
  std::vector<Run> runs;
  std::vector<Placement> grad_out;  // the source's gradient layout
  at::Tensor param;                 // the source, when it is a parameter (a leaf with grad)
  ScopeCapture scopes;              // of the thread that built the node, for its backward
};

// Moves data src -> dst; backward runs each move's reverse, or, with a declared gradient layout,
// one planned move of the gradient to the source's gradient layout.
class Relayout : public torch::autograd::Function<Relayout> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<RelayoutState> state) {
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    state->scopes = ScopeCapture::current();
    RelayoutSpec& spec = state->spec;
    if (spec.done.defined()) {
      at::Tensor out = spec.done.detach();
      spec.done = at::Tensor();  // the output holds it; the state must not
      return out;
    }
    if (spec.src == spec.dst) return x.view_as(x);
    // Inputs and outputs of the moves whose backward needs them, saved through the context
    // (the last output is this node's own output).
    std::vector<at::Tensor> io;
    at::Tensor y = x;
    for (const Run& r : state->runs) {
      const Move& m = move_of(r.step.kind);
      at::Tensor next = m.forward(r, y);
      if (!spec.grad_in && m.keeps_io(r.step)) {
        io.push_back(y);
        io.push_back(next);
      }
      y = std::move(next);
    }
    if (!io.empty()) ctx->save_for_backward(io);
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto s =
        c10::static_intrusive_pointer_cast<RelayoutState>(ctx->saved_data["state"].toCapsule());
    // Autograd may run this on a thread of its own (CUDA): record and defer as the builder would.
    const ScopeLoan loan(s->scopes);
    const RelayoutSpec& spec = s->spec;
    if (spec.grad_in) return {declared_backward(*s, grads[0]), at::Tensor()};
    if (spec.src == spec.dst) return {grads[0], at::Tensor()};
    const auto io = ctx->get_saved_variables();
    std::size_t next_io = io.size();
    at::Tensor grad = grads[0];
    for (auto it = s->runs.rbegin(); it != s->runs.rend(); ++it) {
      const Move& m = move_of(it->step.kind);
      at::Tensor x, y;
      if (m.keeps_io(it->step)) {
        next_io -= 2;
        x = io[next_io];
        y = io[next_io + 1];
      }
      grad = m.backward(*it, grad, x, y);
    }
    return {grad, at::Tensor()};
  }

 private:
  static at::Tensor declared_backward(const RelayoutState& s, const at::Tensor& grad) {
    const std::vector<Placement>& in = *s.spec.grad_in;
    if (s.param.defined()) {
      // Data parallel: a parameter whose gradient only needs summing over some rows may wait
      // for the thread's gradient hook (GradientBuckets) to sum it with others.
      std::vector<int64_t> sums;
      bool only_sums = true;
      for (std::size_t m = 0; m < in.size(); ++m) {
        if (in[m] == s.grad_out[m]) continue;
        if (is_partial(in[m]) && std::get<Partial>(in[m]).op == ReduceOp::kSum &&
            is_replicate(s.grad_out[m])) {
          sums.push_back(static_cast<int64_t>(m));
        } else {
          only_sums = false;
        }
      }
      GradientReductionHook* hook = current_gradient_hook();
      if (only_sums && !sums.empty() && hook != nullptr &&
          hook->defer(s.param, *s.spec.mesh, sums, grad)) {
        return at::Tensor();
      }
    }
    return move_data(grad, s.spec.global_shape, *s.spec.mesh, in, s.grad_out);
  }
};

}  // namespace

void check_reachable(const std::vector<Placement>& src, const std::vector<Placement>& dst) {
  plan_redistribute(src, dst);
}

std::vector<Placement> gradient_layout(std::vector<Placement> placements) {
  for (Placement& p : placements) {
    if (is_partial(p)) p = Replicate{};
  }
  return placements;
}

at::Tensor move_data(const at::Tensor& local, const std::vector<int64_t>& global_shape,
                     const DeviceMesh& mesh, const std::vector<Placement>& src,
                     const std::vector<Placement>& dst) {
  at::NoGradGuard no_grad;
  at::Tensor x = local;
  for (const Run& r : runs_of(global_shape, mesh, src, dst)) x = move_of(r.step.kind).forward(r, x);
  return x;
}

at::Tensor relayout(const at::Tensor& local, RelayoutSpec spec) {
  // Nothing to move and no gradient layout to honour: the tensor itself, no node.
  if (spec.src == spec.dst && !spec.grad_in && !spec.done.defined()) return local;
  auto state = c10::make_intrusive<RelayoutState>();
  state->runs = runs_of(spec.global_shape, *spec.mesh, spec.src, spec.dst);
  state->grad_out = gradient_layout(spec.src);
  if (spec.grad_in && local.is_leaf() && local.requires_grad()) state->param = local;
  state->spec = std::move(spec);
  return Relayout::apply(local, state);
}

}  // namespace te::detail
