#pragma once

// Parameter initialisation: a per-thread generator (so ranks that are threads of one process
// initialise identically) and the Flax / TE initialisers the modules default to.

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace te::nn {

/// Seeds this thread's parameter generator (every rank calls it with the same seed to build the
/// same global weights) and restarts its dropout stream at {seed, 0} (te/nn/random.h), so every
/// rank also draws the same global dropout masks. Threads start seeded with 0.
void manual_seed(uint64_t seed);

/// Flax's variance_scaling(scale, mode, distribution) for a kernel whose first `in_dims` dims are
/// the inputs (fan_in) and the rest the outputs (fan_out). mode: "fan_in" | "fan_out" |
/// "fan_avg"; distribution: "normal" | "truncated_normal" | "uniform". Uses this thread's
/// generator.
at::Tensor variance_scaling(const std::vector<int64_t>& shape, int64_t in_dims, double scale,
                            const std::string& mode, const std::string& distribution);

/// Normal(0, stddev) truncated to [-2, 2] standard deviations, as jax.random.truncated_normal
/// (the stddev given is that of the truncated distribution, as Flax's initialisers do).
at::Tensor truncated_normal(const std::vector<int64_t>& shape, double stddev);

/// Flax's default embedding init: variance_scaling(1, fan_in, normal) over the embedding dim.
at::Tensor normal(const std::vector<int64_t>& shape, double stddev);

/// While alive, te::nn modules built on this thread get their parameters on the meta device:
/// every shape, logical axis and placement as a real build gives them, but no data, no random
/// draws and no memory (the initialisers above return meta tensors). What te::nn::plan builds
/// its model with; a forward of such a module runs on meta tensors too. Scopes nest.
class MetaParameterScope {
 public:
  MetaParameterScope();
  ~MetaParameterScope();
  MetaParameterScope(const MetaParameterScope&) = delete;
  MetaParameterScope& operator=(const MetaParameterScope&) = delete;
};
/// True while a MetaParameterScope is alive on this thread.
bool meta_parameters();

/// While alive, the initialisers above return uninitialised tensors (no random draws, so the
/// generator does not advance): for building a module whose parameters a load overwrites
/// (te::hf::load_causal_lm builds under it; drawing a 135M-parameter model's initial values took
/// 9 of its 10 s). Constant initial values (zero biases, unit scales) are set as usual. Scopes
/// nest; a MetaParameterScope inside one wins.
class EmptyParameterScope {
 public:
  EmptyParameterScope();
  ~EmptyParameterScope();
  EmptyParameterScope(const EmptyParameterScope&) = delete;
  EmptyParameterScope& operator=(const EmptyParameterScope&) = delete;
};
/// True while an EmptyParameterScope is alive on this thread.
bool empty_parameters();

}  // namespace te::nn
