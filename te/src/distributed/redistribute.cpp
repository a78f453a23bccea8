// Redistribute: plans the per-mesh-dim transitions from one set of placements to another and runs
// each as a differentiable step whose backward is the reverse transition.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "internal.h"
#include "redistribute.h"
#include "te/error.h"

namespace te::detail {

namespace {

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

}  // namespace

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
        steps.push_back({Step::Kind::kAllToAll, static_cast<int64_t>(jj), d, e, ReduceOp::kSum});
        cur[jj] = dst[jj];
        continue;
      }
    }
    steps.push_back({Step::Kind::kGather, static_cast<int64_t>(jj), d, -1, ReduceOp::kSum});
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
        steps.push_back({Step::Kind::kReduceScatter, static_cast<int64_t>(j), e, -1, op});
        cur[j] = dst[j];
        continue;
      }
    }
    steps.push_back({Step::Kind::kReduce, static_cast<int64_t>(j), -1, -1, op});
    cur[j] = Replicate{};
  }

  // C: cut the target shards, major to minor (no communication).
  for (std::size_t i = 0; i < n; ++i) {
    if (cur[i] == dst[i]) continue;
    TE_CHECK(is_replicate(cur[i]) && is_shard(dst[i]), "internal: redistribute plan reached ",
             to_string(cur[i]), " -> ", to_string(dst[i]), " on mesh dim ", i);
    steps.push_back(
        {Step::Kind::kSlice, static_cast<int64_t>(i), std::get<Shard>(dst[i]).dim, -1,
         ReduceOp::kSum});
    cur[i] = dst[i];
  }
  return steps;
}

namespace {

// Everything one step needs to run forward and backward, kept alive by the autograd graph.
struct StepState : torch::CustomClassHolder {
  Step step;
  const Group* group = nullptr;
  std::shared_ptr<const MeshState> mesh;  // keeps `group` alive
  int64_t full = 0;   // whole size of step.dim in the row's context (gather / slice / scatter)
  int64_t full2 = 0;  // whole size of step.dim2 (all-to-all's target dim)
};

at::Tensor slice_chunk(const Group& g, const at::Tensor& t, int64_t dim) {
  const Chunk c = chunk_of(t.size(dim), g.size, g.rank);
  return t.narrow(dim, c.offset, c.length).clone();
}

at::Tensor run_forward(const StepState& s, const at::Tensor& x) {
  const Group& g = *s.group;
  switch (s.step.kind) {
    case Step::Kind::kGather:
      return all_gather(g, x, s.step.dim, s.full);
    case Step::Kind::kSlice:
      return slice_chunk(g, x, s.step.dim);
    case Step::Kind::kAllToAll:
      return all_to_all(g, x, s.step.dim, s.full, s.step.dim2);
    case Step::Kind::kReduce:
      return all_reduce(g, x, s.step.op);
    case Step::Kind::kReduceScatter:
      return reduce_scatter(g, x, s.step.op, s.step.dim);
  }
  TE_FAIL("internal: unknown redistribute step");
}

class RedistributeStep : public torch::autograd::Function<RedistributeStep> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<StepState> state) {
    at::Tensor y = run_forward(*state, x);
    if (state->step.kind == Step::Kind::kReduce &&
        (state->step.op == ReduceOp::kMax || state->step.op == ReduceOp::kMin)) {
      ctx->save_for_backward({x, y});
    }
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto state = c10::static_intrusive_pointer_cast<StepState>(
        ctx->saved_data["state"].toCapsule());
    const StepState& s = *state;
    const Group& g = *s.group;
    at::Tensor grad = grads[0];
    at::Tensor out;
    switch (s.step.kind) {
      case Step::Kind::kGather:
        out = slice_chunk(g, grad, s.step.dim);
        break;
      case Step::Kind::kSlice:
        out = all_gather(g, grad, s.step.dim, s.full);
        break;
      case Step::Kind::kAllToAll:
        out = all_to_all(g, grad, s.step.dim2, s.full2, s.step.dim);
        break;
      case Step::Kind::kReduceScatter:
        out = all_gather(g, grad, s.step.dim, s.full);
        if (s.step.op == ReduceOp::kAvg) out = out / static_cast<double>(g.size);
        break;
      case Step::Kind::kReduce:
        switch (s.step.op) {
          case ReduceOp::kSum:
            out = grad.clone();
            break;
          case ReduceOp::kAvg:
            out = grad / static_cast<double>(g.size);
            break;
          case ReduceOp::kMax:
          case ReduceOp::kMin: {
            // As for amax over a stacked dim: the gradient goes to the ranks holding the
            // extreme value, split evenly among ties.
            const auto saved = ctx->get_saved_variables();
            at::Tensor mask = saved[0].eq(saved[1]).to(grad.scalar_type());
            at::Tensor ties = all_reduce(g, mask, ReduceOp::kSum);
            out = grad * mask / ties;
            break;
          }
        }
        break;
    }
    return {out, at::Tensor()};
  }
};

}  // namespace

at::Tensor run_redistribute(const at::Tensor& local, const std::vector<int64_t>& global_shape,
                            const DeviceMesh& mesh, const std::vector<Placement>& src,
                            const std::vector<Placement>& dst) {
  const std::vector<Step> steps = plan_redistribute(src, dst);
  at::Tensor x = local;
  std::vector<Placement> cur = src;
  for (const Step& step : steps) {
    const Group& g = mesh.state().groups[static_cast<std::size_t>(step.mesh_dim)];
    const std::size_t j = static_cast<std::size_t>(step.mesh_dim);
    std::vector<Placement> next = cur;
    switch (step.kind) {
      case Step::Kind::kGather:
      case Step::Kind::kReduce:
        next[j] = Replicate{};
        break;
      case Step::Kind::kSlice:
      case Step::Kind::kAllToAll:
      case Step::Kind::kReduceScatter:
        next[j] = Shard{step.kind == Step::Kind::kAllToAll ? step.dim2 : step.dim};
        break;
    }
    if (g.size > 1) {
      auto st = c10::make_intrusive<StepState>();
      st->step = step;
      st->group = &g;
      st->mesh = mesh.shared_state();
      // The whole extent of a dim within this row: its size with this mesh dim replicated.
      std::vector<Placement> whole = cur;
      whole[j] = Replicate{};
      const auto chunks = local_chunks(global_shape, mesh, whole, mesh.rank());
      if (step.dim >= 0) st->full = chunks[static_cast<std::size_t>(step.dim)].length;
      if (step.dim2 >= 0) st->full2 = chunks[static_cast<std::size_t>(step.dim2)].length;
      x = RedistributeStep::apply(x, st);
    }
    cur = std::move(next);
  }
  return x;
}

}  // namespace te::detail
