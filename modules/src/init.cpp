#include "te/nn/init.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <optional>

#include "te/error.h"
#include "te/nn/random.h"
#include "te/scope_stack.h"

namespace te::nn {

namespace {

at::Generator& generator() {
  thread_local at::Generator gen = at::detail::createCPUGenerator(0);
  return gen;
}

std::vector<int64_t> checked(const std::vector<int64_t>& shape) {
  for (int64_t s : shape) TE_CHECK(s >= 0, "initialiser: negative size in the shape");
  return shape;
}

// The parameter modes open on this thread (te/scope_stack.h).
ScopeStack<bool>& meta_scopes() {
  thread_local ScopeStack<bool> stack;
  return stack;
}

ScopeStack<bool>& empty_scopes() {
  thread_local ScopeStack<bool> stack;
  return stack;
}

at::Tensor meta(const std::vector<int64_t>& shape) {
  return at::empty(checked(shape), at::TensorOptions().device(at::kMeta));
}

}  // namespace

MetaParameterScope::MetaParameterScope() { meta_scopes().push(this, true); }
MetaParameterScope::~MetaParameterScope() { meta_scopes().pop(this); }
bool meta_parameters() { return !meta_scopes().empty(); }

EmptyParameterScope::EmptyParameterScope() { empty_scopes().push(this, true); }
EmptyParameterScope::~EmptyParameterScope() { empty_scopes().pop(this); }
bool empty_parameters() { return !empty_scopes().empty(); }

void manual_seed(uint64_t seed) {
  generator() = at::detail::createCPUGenerator(seed);
  set_rng_state({seed, 0});
}

at::Tensor normal(const std::vector<int64_t>& shape, double stddev) {
  if (meta_parameters()) return meta(shape);
  if (empty_parameters()) return at::empty(checked(shape));
  return at::normal(0.0, stddev, checked(shape), generator());
}

at::Tensor truncated_normal(const std::vector<int64_t>& shape, double stddev) {
  // Sample N(0, 1), redraw what falls outside [-2, 2], then scale so the truncated
  // distribution has standard deviation `stddev` (its std is 0.87962566103423978 of N(0, 1)'s).
  if (meta_parameters()) return meta(shape);
  if (empty_parameters()) return at::empty(checked(shape));
  at::Tensor t = at::normal(0.0, 1.0, checked(shape), generator());
  while (true) {
    at::Tensor outside = t.abs() > 2.0;
    const int64_t n = outside.sum().item<int64_t>();
    if (n == 0) break;
    t.masked_scatter_(outside, at::normal(0.0, 1.0, {n}, generator()));
  }
  return t * (stddev / 0.87962566103423978);
}

at::Tensor variance_scaling(const std::vector<int64_t>& shape, int64_t in_dims, double scale,
                            const std::string& mode, const std::string& distribution) {
  TE_CHECK(in_dims >= 0 && in_dims <= static_cast<int64_t>(shape.size()),
           "variance_scaling: in_dims ", in_dims, " for a ", shape.size(), "-dim shape");
  double fan_in = 1, fan_out = 1;
  for (int64_t i = 0; i < static_cast<int64_t>(shape.size()); ++i) {
    (i < in_dims ? fan_in : fan_out) *= static_cast<double>(shape[static_cast<std::size_t>(i)]);
  }
  double denominator = fan_in;
  if (mode == "fan_out") {
    denominator = fan_out;
  } else if (mode == "fan_avg") {
    denominator = (fan_in + fan_out) / 2;
  } else {
    TE_CHECK(mode == "fan_in", "variance_scaling: mode '", mode,
             "' is not one of fan_in, fan_out, fan_avg");
  }
  const double variance = scale / std::max(1.0, denominator);
  if (distribution == "normal") return normal(shape, std::sqrt(variance));
  if (distribution == "truncated_normal") return truncated_normal(shape, std::sqrt(variance));
  TE_CHECK(distribution == "uniform", "variance_scaling: distribution '", distribution,
           "' is not one of normal, truncated_normal, uniform");
  const double limit = std::sqrt(3 * variance);
  if (meta_parameters()) return meta(shape);
  if (empty_parameters()) return at::empty(checked(shape));
  return at::empty(checked(shape)).uniform_(-limit, limit, generator());
}

}  // namespace te::nn
