// FP8 formats and the scaling recipes' arithmetic (docs/ARCHITECTURE.md §5).

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>

#include "te/error.h"
#include "te/fp8.h"

namespace te::fp8 {

DType forward_dtype(Format) { return DType::kE4M3; }
DType backward_dtype(Format format) {
  return format == Format::kHybrid ? DType::kE5M2 : DType::kE4M3;
}

Format format_of(const Recipe& recipe) {
  return std::visit([](const auto& r) { return r.fp8_format; }, recipe);
}

void validate_recipe(const Recipe& recipe) {
  if (const auto* d = std::get_if<DelayedScaling>(&recipe)) {
    TE_CHECK(d->amax_history_len >= 1, "DelayedScaling: amax_history_len is ", d->amax_history_len,
             "; it needs at least 1 (TE's default is 1024)");
    TE_CHECK(d->margin >= 0, "DelayedScaling: margin is ", d->margin,
             "; it is a non-negative power-of-two backoff (0 by default)");
    TE_CHECK(d->amax_compute_algo == "max" || d->amax_compute_algo == "most_recent",
             "DelayedScaling: amax_compute_algo '", d->amax_compute_algo,
             "' is not 'max' or 'most_recent'");
  }
}

std::string to_string(const Recipe& recipe) {
  std::ostringstream os;
  const char* format = format_of(recipe) == Format::kHybrid ? "HYBRID" : "E4M3";
  if (const auto* d = std::get_if<DelayedScaling>(&recipe)) {
    os << "DelayedScaling(margin=" << d->margin << ", format=" << format
       << ", amax_history_len=" << d->amax_history_len
       << ", amax_compute_algo=" << d->amax_compute_algo << ")";
  } else {
    os << "CurrentScaling(format=" << format << ")";
  }
  return os.str();
}

float compute_scale(float amax, float old_scale, float fp8_max, int margin) {
  if (!(amax > 0.0f) || !std::isfinite(amax)) return old_scale;
  const float scale = (fp8_max / amax) / std::ldexp(1.0f, margin);
  return std::isfinite(scale) ? scale : old_scale;
}

void update_scales(const at::Tensor& amax_history, const at::Tensor& scale,
                   const at::Tensor& scale_inv, const DelayedScaling& recipe, DType dtype) {
  TE_CHECK(amax_history.dim() == 2 && scale.dim() == 1 && scale_inv.dim() == 1 &&
               amax_history.size(1) == scale.size(0) && scale.size(0) == scale_inv.size(0),
           "update_scales: amax_history ", amax_history.sizes(), ", scale ", scale.sizes(),
           " and scale_inv ", scale_inv.sizes(), " must be [L, n], [n] and [n]");
  TE_CHECK(amax_history.scalar_type() == at::kFloat && scale.scalar_type() == at::kFloat &&
               scale_inv.scalar_type() == at::kFloat,
           "update_scales: the FP8 state must be fp32");
  at::NoGradGuard no_grad;
  const at::Tensor amax = recipe.amax_compute_algo == "most_recent"
                              ? amax_history[0]
                              : std::get<0>(amax_history.max(0));
  // The same fp32 operations as compute_scale, elementwise.
  const at::Tensor quotient =
      at::div(at::full_like(amax, max_finite(dtype)), amax) / std::ldexp(1.0, recipe.margin);
  const at::Tensor keep = (amax > 0) & at::isfinite(amax) & at::isfinite(quotient);
  const at::Tensor next = at::where(keep, quotient, scale);
  scale.copy_(next);
  scale_inv.copy_(at::reciprocal(next));
  amax_history.copy_(at::roll(amax_history, {-1}, {0}));
  amax_history[0].zero_();
}

}  // namespace te::fp8
