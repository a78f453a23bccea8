// The recipe handle, the registry of recipe names, and the scale rule current and block scaling
// share (docs/ARCHITECTURE.md §5). Each recipe's behaviour is in its own file (delayed.cpp,
// current.cpp, block.cpp, mxfp8.cpp, nvfp4.cpp).

#include <ATen/ATen.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>

#include "recipe_impl.h"
#include "te/error.h"

namespace te::fp8 {

DType forward_dtype(Format) { return DType::kE4M3; }
DType backward_dtype(Format format) {
  return format == Format::kHybrid ? DType::kE5M2 : DType::kE4M3;
}

void check_amax_epsilon(const char* recipe, float epsilon) {
  TE_CHECK(std::isfinite(epsilon) && epsilon >= 0.0f, recipe, ": amax_epsilon is ", epsilon,
           "; it is a non-negative floor for the amax (0 by default)");
}

const char* format_name(Format format) { return format == Format::kHybrid ? "HYBRID" : "E4M3"; }

Recipe::Recipe(RecipeSettings settings, std::nullptr_t) : settings_(std::move(settings)) {
  impl_ = std::visit([](const auto& recipe) { return implement(recipe); }, settings_);
}

std::string Recipe::name() const { return impl_->name(); }
Format Recipe::format() const { return impl_->format(); }
std::string Recipe::to_string() const { return impl_->to_string(); }

namespace {

// The registration: a recipe's name, what it is in a few words (for --help), its default settings.
struct Registered {
  const char* name;
  const char* summary;
  std::function<Recipe()> make;
};

const std::vector<Registered>& registry() {
  static const std::vector<Registered> all{
      {"delayed", "DelayedScaling: per-tensor scales from an amax history, HYBRID",
       [] { return Recipe(DelayedScaling{}); }},
      {"current", "CurrentScaling: per-tensor scales from each tensor's amax, HYBRID",
       [] { return Recipe(CurrentScaling{}); }},
      {"block", "Float8BlockScaling: fp32 scales per 1x128 block / 128x128 weight tile, E4M3",
       [] { return Recipe(Float8BlockScaling{}); }},
      {"mxfp8", "MXFP8BlockScaling: E8M0 scales per 1x32 block, E4M3",
       [] { return Recipe(MXFP8BlockScaling{}); }},
      {"nvfp4",
       "NVFP4BlockScaling: E2M1 with E4M3 scales per 1x16 block / 16x16 weight tile and an FP32 "
       "tensor scale; Hadamard-transformed wgrad operands, stochastically rounded gradients",
       [] { return Recipe(NVFP4BlockScaling{}); }},
  };
  return all;
}

}  // namespace

std::vector<std::string> recipe_names() {
  std::vector<std::string> out;
  for (const Registered& r : registry()) out.emplace_back(r.name);
  return out;
}

std::string recipe_summary() {
  std::ostringstream os;
  for (const Registered& r : registry()) {
    os << (os.tellp() > 0 ? ", " : "") << r.name << " (" << r.summary << ")";
  }
  return os.str();
}

Recipe recipe_named(const std::string& name) {
  std::ostringstream names;
  for (const Registered& r : registry()) {
    if (name == r.name) return r.make();
    names << (names.tellp() > 0 ? ", " : "") << r.name;
  }
  TE_FAIL("FP8 recipe '", name, "' is not one of: ", names.str());
}

at::Tensor scales_from_amax(const at::Tensor& amax_in, float fp8_max, bool power_2, float epsilon) {
  TE_CHECK(amax_in.scalar_type() == at::kFloat, "fp8::scales_from_amax: the amaxes are ",
           amax_in.scalar_type(), "; give fp32");
  at::NoGradGuard no_grad;
  // scale_from_amax's fp32 operations, elementwise on the amaxes' device.
  const at::Tensor amax =
      epsilon > 0.0f ? at::where(amax_in < epsilon, at::full_like(amax_in, epsilon), amax_in)
                     : amax_in;
  at::Tensor scale = at::div(at::full_like(amax, fp8_max), amax);
  // Comparisons only (no isnan/isinf): they run on meta tensors too (the planner's dry run).
  const float inf = std::numeric_limits<float>::infinity();
  scale = at::where(scale == inf, at::full_like(scale, FLT_MAX), scale);
  if (power_2) {
    scale = at::bitwise_and(scale.contiguous().view(at::kInt), static_cast<int32_t>(0xFF800000u))
                .view(at::kFloat);
  }
  const at::Tensor unit = (amax.abs() == inf) | (amax == 0) | (amax != amax);
  return at::where(unit, at::ones_like(scale), scale);
}

}  // namespace te::fp8
