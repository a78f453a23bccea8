#include "te/nn/dense.h"

#include <ATen/ATen.h>

#include "constrain.h"
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
  fp8_meta = fp8::GemmMeta::registered(*this, "");
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

at::Tensor DenseImpl::forward(const at::Tensor& input) {
  require_unsharded(*this, "Dense");
  at::Tensor x = constrain(input, options.input_axes());
  // The bias goes into the GEMM: on a plain tensor the output constraint only checks the axes, so
  // adding it before the constraint is the DTensor forward's order in effect.
  return constrain(F::dense(x, kernel, fp8_meta, nullptr, bias), options.output_axes());
}

DTensor DenseImpl::forward(const DTensor& input) { return project(input, options.input_axes()); }

DTensor DenseImpl::project(const DTensor& x, const LogicalAxes& input_axes) {
  // The input constraint is folded into the matmul's redistribution (see F::dense).
  DTensor y = F::dense(x, as_dtensor("kernel", kernel, x.mesh()), input_axes, fp8_meta);
  // Constrain before the bias: a partial result then reduces straight into the requested
  // layout (e.g. reduce-scattered under sequence parallelism) instead of all-reduced first.
  y = constrain(y, options.output_axes());
  if (bias.defined()) y = F::add_bias(y, as_dtensor("bias", bias, x.mesh()));
  return y;
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

at::Tensor LayerNormImpl::forward(const at::Tensor& input) {
  require_unsharded(*this, "LayerNorm");
  TE_CHECK(input.dim() >= 1 && input.size(-1) == options.hidden_size(), "LayerNorm: input ",
           input.sizes(), " does not end in hidden_size ", options.hidden_size());
  return F::layer_norm(input, scale, ln_bias, options.epsilon(), options.zero_centered_gamma(),
                       options.layernorm_type() == "rmsnorm");
}

DTensor LayerNormImpl::forward(const DTensor& input) {
  TE_CHECK(input.dim() >= 1 && input.size(-1) == options.hidden_size(), "LayerNorm: input ",
           input.to_string(), " does not end in hidden_size ", options.hidden_size());
  std::optional<DTensor> beta;
  if (ln_bias.defined()) beta = as_dtensor("ln_bias", ln_bias, input.mesh());
  return F::layer_norm(input, as_dtensor("scale", scale, input.mesh()), beta, options.epsilon(),
                       options.zero_centered_gamma(), options.layernorm_type() == "rmsnorm");
}

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

std::pair<at::Tensor, std::optional<at::Tensor>> LayerNormDenseImpl::forward_with_layernorm_output(
    const at::Tensor& input) {
  const at::Tensor ln = layernorm->forward(constrain(input, options.layernorm_input_axes()));
  at::Tensor y = dense->forward(constrain(ln, options.dot_input_axes()));
  return {y, options.return_layernorm_output() ? std::optional<at::Tensor>(ln) : std::nullopt};
}

std::pair<DTensor, std::optional<DTensor>> LayerNormDenseImpl::forward_with_layernorm_output(
    const DTensor& input) {
  const DTensor ln = layernorm->forward(constrain(input, options.layernorm_input_axes()));
  DTensor y = dense->project(ln, options.dot_input_axes().empty() ? dense->options.input_axes()
                                                                  : options.dot_input_axes());
  return {y, options.return_layernorm_output() ? std::optional<DTensor>(ln) : std::nullopt};
}

at::Tensor LayerNormDenseImpl::forward(const at::Tensor& input) {
  return forward_with_layernorm_output(input).first;
}

DTensor LayerNormDenseImpl::forward(const DTensor& input) {
  return forward_with_layernorm_output(input).first;
}

std::vector<ShardedModule::Fp8Gemm> DenseImpl::fp8_gemms() {
  return {{"kernel", &kernel, fp8_meta}};
}

}  // namespace te::nn
