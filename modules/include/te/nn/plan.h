#pragma once

// Sizing a model on a mesh before running it: te::nn::plan runs one training step of a
// TransformerLayer stack as the given rank of a simulated world (te::run_simulated_rank) on meta
// tensors (te/runtime/meta.h). The modules, rules, placements and redistribution planner are the
// ones a real run uses, so the collectives it records are the ones CommTrace records in a real
// run, and the bytes it counts are the allocations a real run makes (tests/nn/test_planner.cpp
// holds both to real runs at 1, 2 and 4 ranks). A mesh of thousands of ranks plans in one
// process in well under a second (bench/bench_plan).

#include <ATen/core/TensorBody.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "te/distributed/comm_trace.h"
#include "te/fp8.h"
#include "te/nn/transformer.h"

namespace te::nn {

/// What to plan: `layers` TransformerLayers of `layer` on a [batch, seqlen, hidden] input, on a
/// mesh of `mesh_shape` named `mesh_axes`, under the rules or MeshResource in scope at the call
/// (as a real run builds its model).
struct PlanOptions {
  PlanOptions(TransformerLayerOptions layer, int64_t layers, int64_t batch, int64_t seqlen)
      : layer_(std::move(layer)), layers_(layers), batch_(batch), seqlen_(seqlen) {}
  TORCH_ARG(TransformerLayerOptions, layer);
  TORCH_ARG(int64_t, layers);
  TORCH_ARG(int64_t, batch);
  TORCH_ARG(int64_t, seqlen);
  /// The mesh (empty: one process).
  TORCH_ARG(std::vector<int64_t>, mesh_shape) = {};
  TORCH_ARG(std::vector<std::string>, mesh_axes) = {};
  /// The parameters' and activations' dtype (kFloat, kBFloat16, kHalf).
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;
  /// The GEMMs under Fp8Autocast with this recipe (none: no FP8).
  TORCH_ARG(std::optional<fp8::Recipe>, fp8) = std::nullopt;
  /// The optimizer whose state is counted: "adam" (two moments per parameter, in its dtype, as
  /// torch::optim::Adam keeps them) or "sgd" (none).
  TORCH_ARG(std::string, optimizer) = "adam";
  /// Data-parallel gradients summed in GradientBuckets of this size after backward (0: each
  /// summed in backward as it is produced).
  TORCH_ARG(int64_t, bucket_bytes) = 25 * 1024 * 1024;
  /// The rank planned for (ranks differ only where a dim splits unevenly).
  TORCH_ARG(int, rank) = 0;
};

/// The collectives of one kind over one mesh axis in one phase of the step.
struct PlannedCollectives {
  /// "forward", "backward" (the gradient buckets included) or "optimizer" (ZeRO's gathers)
  std::string phase;
  Collective kind;
  std::string mesh_axis;
  int64_t count = 0;
  int64_t bytes = 0;  ///< CommRecord's logical payload, summed
};

/// One rank's share of one training step.
struct Plan {
  int64_t world_size = 1;
  int rank = 0;
  std::vector<int64_t> mesh_shape;
  std::vector<std::string> mesh_axes;
  int64_t parameters = 0;  ///< elements this rank holds
  int64_t parameter_bytes = 0;
  int64_t gradient_bytes = 0;
  int64_t optimizer_bytes = 0;
  /// The modules' buffers (each GEMM's FP8 scales and amax histories, kept with or without FP8).
  int64_t buffer_bytes = 0;
  /// Live after the (first micro-batch's) forward beyond the parameters: what it keeps for the
  /// backward.
  int64_t activation_bytes = 0;
  /// The most bytes live at once in forward and backward beyond the parameters (the gradients
  /// made in backward included).
  int64_t step_transient_bytes = 0;
  /// The most bytes live at once in the optimizer's step beyond the parameters, buffers and
  /// optimizer state (the gradients and the step's temporaries); 0 where the plan ran no
  /// optimizer step (PlanOptions: the state is counted, not stepped).
  int64_t optimizer_step_bytes = 0;
  /// parameters + buffers + optimizer state + the larger of step_transient_bytes and
  /// optimizer_step_bytes: what a step needs at its peak once the optimizer state exists.
  int64_t peak_bytes = 0;
  std::vector<PlannedCollectives> collectives;  ///< in first-seen order per phase
  std::vector<CommRecord> forward;              ///< every collective, in order
  std::vector<CommRecord> backward;
  std::vector<CommRecord> optimizer;
  double planning_seconds = 0;

  /// Human-readable: the mesh, memory per rank, and the collectives by phase, kind and axis.
  std::string table() const;
  /// The same as a JSON object.
  std::string to_json() const;
};

/// Plans one training step (forward, backward, gradient reduction) of `options` for one rank.
/// Throws te::Error for a layout the model does not admit (a dim its mesh axes do not divide
/// where that is refused, an unknown axis), exactly as building and running it would.
Plan plan(const PlanOptions& options);

/// A training step of any model, for plan_step. Each part runs on meta tensors on the planned
/// rank's thread, with the simulated mesh (and the caller's rules) in scope; what a part
/// allocates is counted as the real step's allocations are (te::train::plan_lm_step plans
/// te-train's step this way).
struct PlannedStep {
  /// Builds the model (inside a MetaParameterScope) and returns its modules; their FP8 GEMM
  /// state is moved to meta after.
  std::function<std::vector<std::shared_ptr<torch::nn::Module>>()> build;
  /// The forward of micro-batch `micro` (inputs made here count as the step's): returns what
  /// backward starts from, given a gradient of its shape.
  std::function<at::Tensor(int64_t micro)> forward;
  /// Micro-batches of the step, each forward then backward (gradient accumulation: the later
  /// ones' gradients arrive beside the earlier ones'), the data-parallel buckets summed after
  /// the last.
  int64_t micro_batches = 1;
  /// The optimizer's step after backward, over the built modules: what it leaves allocated is
  /// the optimizer state. Unset: none is counted.
  std::function<void()> optimizer_step;
};

/// Where and how a PlannedStep runs.
struct PlanStepOptions {
  std::vector<int64_t> mesh_shape;  ///< empty: one process
  std::vector<std::string> mesh_axes;
  int rank = 0;
  /// Data-parallel gradients summed in GradientBuckets of this size after backward (0: none).
  int64_t bucket_bytes = 25 * 1024 * 1024;
};

/// Plans one step of `step` for one rank: te::Error as building and running it would throw.
Plan plan_step(const PlanStepOptions& options, const PlannedStep& step);

}  // namespace te::nn
