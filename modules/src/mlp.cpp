#include "te/nn/mlp.h"

#include <ATen/ATen.h>

#include <sstream>

#include "constrain.h"
#include "forward.h"
#include "te/error.h"
#include "te/fp8.h"
#include "te/nn/functional.h"
#include "te/nn/init.h"
#include "te/nn/random.h"

namespace te::nn {

namespace F = functional;

LayerNormMLPImpl::LayerNormMLPImpl(const LayerNormMLPOptions& options_) : options(options_) {
  reset();
}

void LayerNormMLPImpl::reset() {
  const int64_t h = options.hidden_size(), f = options.ffn_hidden_size();
  TE_CHECK(h > 0 && f > 0, "LayerNormMLP: hidden_size (", h, ") and ffn_hidden_size (", f,
           ") must be positive");
  TE_CHECK(!options.activations().empty(),
           "LayerNormMLP: activations is empty; use e.g. {\"gelu\"}");
  const int64_t a = static_cast<int64_t>(F::activation_slots(options.activations()).size());
  TE_CHECK(options.activation_params().limit > 0 && options.activation_params().alpha > 0,
           "LayerNormMLP: activation_params limit (", options.activation_params().limit,
           ") and alpha (", options.activation_params().alpha, ") must be positive");
  TE_CHECK(options.intermediate_dropout_rate() >= 0 && options.intermediate_dropout_rate() < 1,
           "LayerNormMLP: intermediate_dropout_rate ", options.intermediate_dropout_rate(),
           " is not in [0, 1)");
  TE_CHECK(options.layernorm().hidden_size() == h, "LayerNormMLP: the norm's hidden_size ",
           options.layernorm().hidden_size(), " differs from hidden_size ", h);
  layernorm = register_module("layernorm", LayerNorm(options.layernorm()));
  wi_kernel = register_sharded(*this, "wi_kernel",
                               variance_scaling({h, a, f}, 1, 1.0, "fan_in", "truncated_normal"),
                               options.kernel_axes_1());
  wo_kernel = register_sharded(*this, "wo_kernel",
                               variance_scaling({f, h}, 1, 1.0, "fan_in", "truncated_normal"),
                               options.kernel_axes_2());
  wi_fp8 = register_fp8_gemm(*this, "wi_");
  wo_fp8 = register_fp8_gemm(*this, "wo_");
  if (options.use_bias()) {
    wi_bias = register_sharded(*this, "wi_bias", at::zeros({a, f}), options.bias_axes_1());
    wo_bias = register_sharded(*this, "wo_bias", at::zeros({h}), options.bias_axes_2());
  } else {
    wi_bias = wo_bias = at::Tensor();
  }
}

void LayerNormMLPImpl::pretty_print(std::ostream& stream) const {
  stream << "te::nn::LayerNormMLP(hidden_size=" << options.hidden_size()
         << ", ffn_hidden_size=" << options.ffn_hidden_size() << ", activations=(";
  for (std::size_t i = 0; i < options.activations().size(); ++i) {
    stream << (i ? ", " : "") << options.activations()[i];
  }
  stream << "), dropout=" << options.intermediate_dropout_rate()
         << ", bias=" << (options.use_bias() ? "true" : "false") << ")";
}

namespace {

// LayerNormMLP's one forward (modules/src/forward.h).
template <typename T>
std::pair<T, T> mlp_forward(LayerNormMLPImpl& self, const T& input) {
  detail::enter(self, "LayerNormMLP", input);
  const LayerNormMLPOptions& o = self.options;
  const T ln = self.layernorm->forward(constrain(input, o.layernorm_input_axes()));
  const T h = detail::project(self, ln, "wi_", self.wi_kernel, self.wi_bias, self.wi_fp8,
                              o.dot_1_input_axes(), {});
  T act = F::mlp_activation(h, o.activations(), o.activation_params());
  act = F::dropout(act, o.intermediate_dropout_rate(), self.is_training());
  return {detail::project(self, act, "wo_", self.wo_kernel, self.wo_bias, self.wo_fp8,
                          o.dot_2_input_axes(), o.output_axes()),
          ln};
}

}  // namespace

at::Tensor LayerNormMLPImpl::forward(const at::Tensor& input) {
  return mlp_forward(*this, input).first;
}
DTensor LayerNormMLPImpl::forward(const DTensor& input) { return mlp_forward(*this, input).first; }
std::pair<at::Tensor, at::Tensor> LayerNormMLPImpl::forward_with_layernorm_output(
    const at::Tensor& input) {
  return mlp_forward(*this, input);
}
std::pair<DTensor, DTensor> LayerNormMLPImpl::forward_with_layernorm_output(const DTensor& input) {
  return mlp_forward(*this, input);
}

std::vector<ShardedModule::Fp8Gemm> LayerNormMLPImpl::fp8_gemms() {
  return {{"wi_kernel", wi_kernel, wi_fp8}, {"wo_kernel", wo_kernel, wo_fp8}};
}

void LayerNormMLPImpl::forget_member(const std::string& name) {
  if (name == "wi_kernel") {
    wi_kernel = at::Tensor();
  } else if (name == "wo_kernel") {
    wo_kernel = at::Tensor();
  } else {
    ShardedModule::forget_member(name);
  }
}

}  // namespace te::nn
