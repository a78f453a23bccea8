// te::optim::grad_norm and clip_grad_norm over sharded parameters (see clip_grad.h).

#include "te/optim/clip_grad.h"

#include <ATen/Dispatch.h>
#include "te/runtime/parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "te/distributed/placement.h"
#include "te/error.h"
#include "te/nn/sharded.h"

namespace te::optim {

namespace {

// The parameters whose local sums are reduced over the same mesh dims of the same mesh.
struct Group {
  std::optional<DeviceMesh> mesh;
  std::vector<int64_t> dims;
  at::Tensor sum;      // float64 scalar: sum of |g|^p, or max |g| for the infinity norm
  double squares = 0;  // the 2-norm's sum of squares of the pieces squares_in_double takes
};

template <typename T>
double block_squares(const T* x, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int u = 0; u < 8; ++u) {
      const double v = static_cast<float>(x[i + u]);
      acc[u] += v * v;
    }
  }
  for (; i < n; ++i) {
    const double v = static_cast<float>(x[i]);
    acc[0] += v * v;
  }
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// The sum of squares of a contiguous CPU float32, bfloat16 or float16 gradient in double, read
// in place (a widened copy cost the 2-norm of a bf16 SmolLM2 a step as long as its GEMMs'
// tenth): blocks of 2^16 elements summed in double apiece, then the blocks' sums in order (the
// same sum on any number of threads). nullopt for the others.
std::optional<double> squares_in_double(const at::Tensor& grad) {
  const at::ScalarType type = grad.scalar_type();
  if (!grad.device().is_cpu() || !grad.is_contiguous() ||
      (type != at::kFloat && type != at::kBFloat16 && type != at::kHalf)) {
    return std::nullopt;
  }
  constexpr int64_t kBlock = int64_t{1} << 16;
  const int64_t n = grad.numel(), blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> sums(static_cast<std::size_t>(blocks));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, type, "grad_norm", [&] {
    const scalar_t* x = grad.data_ptr<scalar_t>();
    at::parallel_for(0, blocks, 1, [&](int64_t first, int64_t last) {
      for (int64_t b = first; b < last; ++b) {
        sums[static_cast<std::size_t>(b)] =
            block_squares(x + b * kBlock, std::min(kBlock, n - b * kBlock));
      }
    });
  });
  double total = 0;
  for (const double v : sums) total += v;
  return total;
}

}  // namespace

double grad_norm(const torch::nn::Module& module, double norm_type) {
  TE_CHECK(norm_type > 0, "grad_norm: norm_type ", norm_type,
           " is not positive; give 2 (Euclidean), 1, or infinity");
  const bool inf = std::isinf(norm_type);
  const auto layouts = te::nn::named_parameter_layouts(module);
  // Keyed by the mesh and the dims, in the same order on every rank (the layouts are).
  std::map<std::pair<std::string, std::vector<int64_t>>, Group> groups;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    std::optional<DeviceMesh> mesh;
    std::vector<int64_t> dims;
    const auto layout = layouts.find(item.key());
    if (layout != layouts.end() && layout->second.mesh) {
      mesh = layout->second.mesh;
      for (std::size_t d = 0; d < layout->second.placements.size(); ++d) {
        const Placement& p = layout->second.placements[d];
        TE_CHECK(!is_partial(p), "grad_norm: parameter '", item.key(), "' is ", to_string(p),
                 " on ", mesh->to_string(), "; a parameter is Shard or Replicate");
        if (is_shard(p)) dims.push_back(static_cast<int64_t>(d));
      }
    }
    Group& g = groups[{mesh ? mesh->to_string() : std::string(), dims}];
    if (!g.sum.defined()) {
      g.mesh = mesh;
      g.dims = dims;
      g.sum = at::zeros({}, at::kDouble);
    }
    const at::Tensor& grad = item.value().grad();
    if (!grad.defined() || grad.numel() == 0) continue;
    // Each piece's norm in double (so a layout's pieces add up to one process's whole tensors
    // to double rounding), the p-th powers summed.
    if (norm_type == 2) {
      if (const auto squares = squares_in_double(grad.detach())) {
        g.squares += *squares;
        continue;
      }
    }
    const at::Tensor n =
        at::linalg_vector_norm(grad.detach(), norm_type, c10::nullopt, false, at::kDouble);
    g.sum = inf ? at::maximum(g.sum, n) : g.sum + n.pow(norm_type);
  }
  double total = 0;
  for (auto& [key, g] : groups) {
    at::Tensor reduced = g.squares != 0 ? g.sum + g.squares : g.sum;
    if (!g.dims.empty()) {
      reduced = g.mesh->all_reduce(reduced, inf ? ReduceOp::kMax : ReduceOp::kSum, g.dims);
    }
    const double v = reduced.item<double>();
    total = inf ? std::max(total, v) : total + v;
  }
  return inf ? total : std::pow(total, 1.0 / norm_type);
}

double clip_grad_norm(torch::nn::Module& module, double max_norm, double norm_type,
                      bool error_if_nonfinite) {
  TE_CHECK(max_norm > 0, "clip_grad_norm: max_norm ", max_norm,
           " is not positive; give the largest gradient norm to allow");
  const double norm = grad_norm(module, norm_type);
  if (!std::isfinite(norm)) {
    TE_CHECK(!error_if_nonfinite, "clip_grad_norm: the gradient's ", norm_type, "-norm is ", norm,
             "; a gradient holds inf or nan (skip this step, or lower the loss scale)");
    return norm;
  }
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1) {
    for (auto& p : module.parameters(/*recurse=*/true)) {
      if (p.grad().defined()) p.mutable_grad().detach().mul_(coefficient);
    }
  }
  return norm;
}

}  // namespace te::optim
