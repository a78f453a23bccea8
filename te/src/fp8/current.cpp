// CurrentScaling (TE's Float8CurrentScaling): each tensor cast with the scale its own amax gives,
// the amax reduced over the mesh first so a rank's piece casts as the whole tensor would.

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>

#include "recipe_impl.h"
#include "te/error.h"

namespace te::fp8 {

namespace {

class Current final : public RecipeImpl {
 public:
  explicit Current(CurrentScaling r) : r_(r) {}

  std::string name() const override { return "current"; }
  Format format() const override { return r_.fp8_format; }
  std::string to_string() const override {
    std::ostringstream os;
    os << "CurrentScaling(format=" << format_name(r_.fp8_format);
    if (r_.use_power_2_scales) os << ", use_power_2_scales=true";
    if (r_.amax_epsilon != 0.0f) os << ", amax_epsilon=" << r_.amax_epsilon;
    os << ")";
    return os.str();
  }

  ForwardCasts cast_forward(const at::Tensor& x, const at::Tensor& w,
                            GemmCall& call) const override {
    const DType dtype = forward_dtype(r_.fp8_format);
    auto xq = cast_transpose(x, scale(x, call, dtype), dtype);
    auto wq = cast_transpose(w, scale(w, call, dtype), dtype);
    return {xq.first, wq.second, xq.second, wq.first};
  }

  ForwardCasts cast_input(const at::Tensor& x, GemmCall& call) const override {
    const DType dtype = forward_dtype(r_.fp8_format);
    auto xq = cast_transpose(x, scale(x, call, dtype), dtype);
    return {xq.first, {}, xq.second, {}};
  }

  // TE's _cast_master_weights_to_fp8_current_scaling (pytorch/tensor/utils.py, d0067d0da): the
  // recipe's own rule on the weight's amax.
  at::Tensor weight_scale(const at::Tensor& amax) const override {
    return scales_from_amax(amax, max_finite(forward_dtype(r_.fp8_format)), r_.use_power_2_scales,
                            r_.amax_epsilon);
  }

  GradCasts cast_grad(const at::Tensor& g, GemmCall& call) const override {
    const DType dtype = backward_dtype(r_.fp8_format);
    auto gq = cast_transpose(g, scale(g, call, dtype), dtype);
    return {gq.first, gq.second};
  }

 private:
  // On the tensor's device: no host round trip.
  at::Tensor scale(const at::Tensor& x, const GemmCall& call, DType dtype) const {
    return scales_from_amax(reduced_amax(x, call), max_finite(dtype), r_.use_power_2_scales,
                            r_.amax_epsilon);
  }

  CurrentScaling r_;
};

}  // namespace

std::shared_ptr<const RecipeImpl> implement(const CurrentScaling& r) {
  check_amax_epsilon("CurrentScaling", r.amax_epsilon);
  return std::make_shared<Current>(r);
}

}  // namespace te::fp8
