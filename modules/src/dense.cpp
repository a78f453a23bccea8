#include "te/nn/dense.h"

#include <ATen/ATen.h>

#include "constrain.h"
#include "forward.h"
#include "te/error.h"
#include "te/fp8.h"
#include "te/nn/functional.h"
#include "te/nn/init.h"

namespace te::nn {

namespace F = functional;

// ---- Dense -------------------------------------------------------------------------------------

DenseImpl::DenseImpl(const DenseOptions& options_) : options(options_) { reset(); }

void DenseImpl::reset() {
  TE_CHECK(options.in_features() > 0 && options.out_features() > 0, "Dense: in_features (",
           options.in_features(), ") and out_features (", options.out_features(),
           ") must be positive");
  const int64_t in = options.in_features(), out = options.out_features();
  kernel = register_sharded(*this, "kernel",
                            variance_scaling({in, out}, 1, 1.0, "fan_in", "truncated_normal"),
                            axes_or_unnamed(options.kernel_axes(), 2));
  fp8_meta = register_fp8_gemm(*this, "");
  if (options.use_bias()) {
    bias =
        register_sharded(*this, "bias", at::zeros({out}), axes_or_unnamed(options.bias_axes(), 1));
  } else {
    bias = at::Tensor();
  }
}

void DenseImpl::pretty_print(std::ostream& stream) const {
  stream << "te::nn::Dense(in_features=" << options.in_features()
         << ", out_features=" << options.out_features()
         << ", bias=" << (options.use_bias() ? "true" : "false");
  if (!options.kernel_axes().empty())
    stream << ", kernel_axes=" << to_string(options.kernel_axes());
  stream << ")";
}

namespace {

// Dense's one forward (modules/src/forward.h): the input constraint folds into the matmul on a
// mesh; the bias follows the output constraint there (a partial product reduces straight into
// the requested layout, e.g. reduce-scattered under sequence parallelism).
template <typename T>
T dense_forward(DenseImpl& self, const T& x, const LogicalAxes& input_axes) {
  detail::enter(self, "Dense", x);
  return detail::project(self, x, "", self.kernel, self.bias, self.fp8_meta, input_axes,
                         self.options.output_axes());
}

}  // namespace

at::Tensor DenseImpl::forward(const at::Tensor& input) {
  return dense_forward(*this, input, options.input_axes());
}
DTensor DenseImpl::forward(const DTensor& input) {
  return dense_forward(*this, input, options.input_axes());
}
at::Tensor DenseImpl::project(const at::Tensor& x, const LogicalAxes& input_axes) {
  return dense_forward(*this, x, input_axes);
}
DTensor DenseImpl::project(const DTensor& x, const LogicalAxes& input_axes) {
  return dense_forward(*this, x, input_axes);
}

// ---- LayerNorm ---------------------------------------------------------------------------------

LayerNormImpl::LayerNormImpl(const LayerNormOptions& options_) : options(options_) { reset(); }

void LayerNormImpl::reset() {
  TE_CHECK(options.hidden_size() > 0, "LayerNorm: hidden_size must be positive, got ",
           options.hidden_size());
  TE_CHECK(options.layernorm_type() == "layernorm" || options.layernorm_type() == "rmsnorm",
           "LayerNorm: layernorm_type '", options.layernorm_type(),
           "' is not 'layernorm' or 'rmsnorm'");
  const int64_t h = options.hidden_size();
  scale = register_sharded(*this, "scale",
                           options.zero_centered_gamma() ? at::zeros({h}) : at::ones({h}),
                           axes_or_unnamed(options.scale_axes(), 1));
  if (options.layernorm_type() == "layernorm") {
    ln_bias =
        register_sharded(*this, "ln_bias", at::zeros({h}), axes_or_unnamed(options.bias_axes(), 1));
  } else {
    ln_bias = at::Tensor();
  }
}

void LayerNormImpl::pretty_print(std::ostream& stream) const {
  stream << "te::nn::LayerNorm(hidden_size=" << options.hidden_size()
         << ", type=" << options.layernorm_type() << ", epsilon=" << options.epsilon()
         << ", zero_centered_gamma=" << (options.zero_centered_gamma() ? "true" : "false") << ")";
}

namespace {

template <typename T>
T layer_norm_forward(LayerNormImpl& self, const T& x) {
  detail::enter(self, "LayerNorm", x);
  TE_CHECK(x.dim() >= 1 && x.size(-1) == self.options.hidden_size(), "LayerNorm: input ",
           detail::shape_of(x), " does not end in hidden_size ", self.options.hidden_size());
  return F::layer_norm(x, detail::param(self, "scale", self.scale, x),
                       detail::param_or_none(self, "ln_bias", self.ln_bias, x),
                       self.options.epsilon(), self.options.zero_centered_gamma(),
                       self.options.layernorm_type() == "rmsnorm");
}

}  // namespace

at::Tensor LayerNormImpl::forward(const at::Tensor& input) {
  return layer_norm_forward(*this, input);
}
DTensor LayerNormImpl::forward(const DTensor& input) { return layer_norm_forward(*this, input); }

// ---- LayerNormDense ----------------------------------------------------------------------------

LayerNormDenseImpl::LayerNormDenseImpl(const LayerNormDenseOptions& options_) : options(options_) {
  reset();
}

void LayerNormDenseImpl::reset() {
  TE_CHECK(options.layernorm().hidden_size() == options.dense().in_features(),
           "LayerNormDense: the norm's hidden_size ", options.layernorm().hidden_size(),
           " differs from the dense in_features ", options.dense().in_features());
  layernorm = register_module("layernorm", LayerNorm(options.layernorm()));
  dense = register_module("dense", Dense(options.dense()));
}

void LayerNormDenseImpl::pretty_print(std::ostream& stream) const {
  stream << "te::nn::LayerNormDense(in_features=" << options.dense().in_features()
         << ", out_features=" << options.dense().out_features()
         << ", type=" << options.layernorm().layernorm_type() << ")";
}

namespace {

template <typename T>
std::pair<T, std::optional<T>> layer_norm_dense_forward(LayerNormDenseImpl& self, const T& x) {
  const T ln = self.layernorm->forward(constrain(x, self.options.layernorm_input_axes()));
  const LogicalAxes& dot_axes = self.options.dot_input_axes().empty()
                                    ? self.dense->options.input_axes()
                                    : self.options.dot_input_axes();
  T y = self.dense->project(ln, dot_axes);
  return {y, self.options.return_layernorm_output() ? std::optional<T>(ln) : std::nullopt};
}

}  // namespace

std::pair<at::Tensor, std::optional<at::Tensor>> LayerNormDenseImpl::forward_with_layernorm_output(
    const at::Tensor& input) {
  return layer_norm_dense_forward(*this, input);
}
std::pair<DTensor, std::optional<DTensor>> LayerNormDenseImpl::forward_with_layernorm_output(
    const DTensor& input) {
  return layer_norm_dense_forward(*this, input);
}

at::Tensor LayerNormDenseImpl::forward(const at::Tensor& input) {
  return forward_with_layernorm_output(input).first;
}
DTensor LayerNormDenseImpl::forward(const DTensor& input) {
  return forward_with_layernorm_output(input).first;
}

std::vector<ShardedModule::Fp8Gemm> DenseImpl::fp8_gemms() {
  return {{"kernel", kernel, fp8_meta}};
}

void DenseImpl::forget_member(const std::string& name) {
  if (name != "kernel") return ShardedModule::forget_member(name);
  kernel = at::Tensor();
}

}  // namespace te::nn
