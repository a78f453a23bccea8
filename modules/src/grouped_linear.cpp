// GroupedLinear and its functional form (te/nn/grouped_linear.h).

#include "te/nn/grouped_linear.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <numeric>
#include <string>

#include "forward.h"
#ifdef TE_TORCH_CUDA
#include "grouped_gemm_cuda.h"
#endif
#include "te/error.h"
#include "te/nn/functional.h"
#include "te/nn/init.h"

namespace te::nn {

namespace functional {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Every group's GEMM in one node: each writes its rows of one output (forward) and of dx, its
// own dkernel[g] and dbias[g] (backward); a group of no rows contributes zeros. On CUDA (fp32,
// bf16, fp16 in a CUDA LibTorch build) the GEMMs of a pass are one cuBLAS grouped GEMM where
// cuBLAS takes them (grouped_gemm_cuda.h), else the loop below; the biases go per group either
// way.
struct GroupedGemm : torch::autograd::Function<GroupedGemm> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& kernel,
                            const at::Tensor& bias, const std::vector<int64_t>& splits) {
    at::Tensor y = at::empty({x.size(0), kernel.size(2)}, x.options());
    ctx->save_for_backward({x, kernel});
    ctx->saved_data["splits"] = c10::IValue(splits);
    ctx->saved_data["bias"] = bias.numel() > 0;
#ifdef TE_TORCH_CUDA
    if (te::nn::detail::grouped_gemm_on_cuda(x) &&
        te::nn::detail::grouped_forward_cuda(x, kernel.contiguous(), splits, y)) {
      if (bias.numel() > 0) {
        int64_t row = 0;
        for (size_t g = 0; g < splits.size(); ++g) {
          if (splits[g] > 0) y.narrow(0, row, splits[g]).add_(bias[g]);
          row += splits[g];
        }
      }
      return y;
    }
#endif
    int64_t row = 0;
    for (size_t g = 0; g < splits.size(); ++g) {
      const int64_t rows = splits[g];
      if (rows == 0) continue;
      at::Tensor out = y.narrow(0, row, rows);
      const at::Tensor in = x.narrow(0, row, rows);
      if (bias.numel() > 0) {
        at::addmm_out(out, bias[g], in, kernel[g]);
      } else {
        at::mm_out(out, in, kernel[g]);
      }
      row += rows;
    }
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &kernel = saved[1];
    const at::Tensor dy = grads[0].contiguous();
    const std::vector<int64_t> splits = ctx->saved_data["splits"].toIntVector();
    const bool with_bias = ctx->saved_data["bias"].toBool();
    const bool want_dx = ctx->needs_input_grad(0), want_dk = ctx->needs_input_grad(1);
    at::Tensor dx = want_dx ? at::empty_like(x) : at::Tensor();
    at::Tensor dk = want_dk ? at::zeros(kernel.sizes(), kernel.options()) : at::Tensor();
    at::Tensor db =
        with_bias ? at::zeros({kernel.size(0), kernel.size(2)}, dy.options()) : at::Tensor();
    // Each gradient the grouped GEMM took is done; the loop makes the rest.
    bool dx_done = !want_dx, dk_done = !want_dk;
#ifdef TE_TORCH_CUDA
    if (te::nn::detail::grouped_gemm_on_cuda(dy)) {
      const at::Tensor k = kernel.contiguous();
      dx_done = dx_done || te::nn::detail::grouped_dgrad_cuda(dy, k, splits, dx);
      dk_done = dk_done || te::nn::detail::grouped_wgrad_cuda(x, dy, splits, dk);
    }
#endif
    int64_t row = 0;
    for (size_t g = 0; g < splits.size(); ++g) {
      const int64_t rows = splits[g];
      if (rows == 0) continue;
      const at::Tensor d = dy.narrow(0, row, rows);
      if (!dx_done) {
        at::Tensor out = dx.narrow(0, row, rows);
        at::mm_out(out, d, kernel[g].t());
      }
      if (!dk_done) {
        at::Tensor out = dk[g];
        at::mm_out(out, x.narrow(0, row, rows).t(), d);
      }
      if (with_bias) db[g].copy_(d.sum(0));
      row += rows;
    }
    return {dx, dk, db, at::Tensor()};
  }
};

}  // namespace

at::Tensor grouped_dense(const at::Tensor& x, const at::Tensor& kernel,
                         const std::vector<int64_t>& m_splits, const at::Tensor& bias,
                         const std::vector<std::shared_ptr<fp8::GemmMeta>>& fp8,
                         const DeviceMesh* mesh, const std::vector<int64_t>* amax_dims) {
  TE_CHECK(kernel.defined() && kernel.dim() == 3, "grouped_dense: kernel is ",
           te::nn::detail::shape_of(kernel), "; give [groups, in, out]");
  const int64_t groups = kernel.size(0), in = kernel.size(1), out = kernel.size(2);
  TE_CHECK(x.defined() && x.dim() == 2 && x.size(1) == in, "grouped_dense: input is ",
           te::nn::detail::shape_of(x), "; give [rows, ", in, "] (the kernel's in_features)");
  TE_CHECK(x.scalar_type() == kernel.scalar_type() && x.device() == kernel.device(),
           "grouped_dense: input is ", x.scalar_type(), " on ", x.device(), " and the kernel ",
           kernel.scalar_type(), " on ", kernel.device(), "; give both in one dtype and device");
  TE_CHECK(static_cast<int64_t>(m_splits.size()) == groups, "grouped_dense: m_splits has ",
           m_splits.size(), " entries for ", groups, " groups; give one row count per group");
  int64_t rows = 0;
  for (const int64_t m : m_splits) {
    TE_CHECK(m >= 0, "grouped_dense: m_splits ", c10::ArrayRef<int64_t>(m_splits),
             " holds a negative count");
    rows += m;
  }
  TE_CHECK(rows == x.size(0), "grouped_dense: m_splits ", c10::ArrayRef<int64_t>(m_splits),
           " sum to ", rows, " rows; the input has ", x.size(0));
  TE_CHECK(!bias.defined() || bias.sizes() == at::IntArrayRef({groups, out}),
           "grouped_dense: bias is ", te::nn::detail::shape_of(bias), "; give [", groups, ", ", out,
           "]");
  TE_CHECK(fp8.empty() || static_cast<int64_t>(fp8.size()) == groups, "grouped_dense: ", fp8.size(),
           " FP8 states for ", groups, " groups; give one per group or none");
  const bool use_fp8 = !fp8.empty() && (fp8_enabled() || fp8_calibrating());
  if (!use_fp8) {
    // No bias travels as an empty tensor: LibTorch 1.13's custom functions take no undefined
    // input.
    const at::Tensor b = bias.defined() ? bias.to(x.scalar_type()) : at::empty({0}, x.options());
    return GroupedGemm::apply(x.contiguous(), kernel, b, m_splits);
  }
  // Under a recipe, each group through dense with its own FP8 state (its own scales).
  std::vector<at::Tensor> parts;
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    if (m_splits[g] == 0 && mesh == nullptr) continue;
    parts.push_back(dense(x.narrow(0, row, m_splits[g]), kernel[g], fp8[g], mesh,
                          bias.defined() ? bias[g] : at::Tensor(), amax_dims));
    row += m_splits[g];
  }
  return parts.empty() ? at::zeros({0, out}, x.options()) : at::cat(parts, 0);
}

}  // namespace functional

GroupedLinearImpl::GroupedLinearImpl(const GroupedLinearOptions& options_) : options(options_) {
  reset();
}

void GroupedLinearImpl::reset() {
  const int64_t groups = options.num_gemms(), in = options.in_features(),
                out = options.out_features();
  TE_CHECK(groups > 0 && in > 0 && out > 0, "GroupedLinear: num_gemms (", groups,
           "), in_features (", in, ") and out_features (", out, ") must be positive");
  std::vector<at::Tensor> kernels;
  for (int64_t g = 0; g < groups; ++g)
    kernels.push_back(variance_scaling({in, out}, 1, 1.0, "fan_in", "truncated_normal"));
  kernel = register_sharded(*this, "kernel", at::stack(kernels),
                            axes_or_unnamed(options.kernel_axes(), 3));
  fp8_metas.clear();
  for (int64_t g = 0; g < groups; ++g)
    fp8_metas.push_back(register_fp8_gemm(*this, std::to_string(g) + "_"));
  if (options.use_bias()) {
    bias = register_sharded(*this, "bias", at::zeros({groups, out}),
                            axes_or_unnamed(options.bias_axes(), 2));
  } else {
    bias = at::Tensor();
  }
}

void GroupedLinearImpl::pretty_print(std::ostream& stream) const {
  stream << "te::nn::GroupedLinear(num_gemms=" << options.num_gemms()
         << ", in_features=" << options.in_features() << ", out_features=" << options.out_features()
         << ", bias=" << (options.use_bias() ? "true" : "false") << ")";
}

at::Tensor GroupedLinearImpl::forward(const at::Tensor& input,
                                      const std::vector<int64_t>& m_splits) {
  detail::enter(*this, "GroupedLinear", input);
  TE_CHECK(input.dim() >= 1 && input.size(-1) == options.in_features(), "GroupedLinear: input ",
           input.sizes(), " does not end in in_features ", options.in_features());
  std::vector<int64_t> shape = input.sizes().vec();
  shape.back() = options.out_features();
  return functional::grouped_dense(input.reshape({-1, options.in_features()}), kernel, m_splits,
                                   bias, fp8_metas)
      .view(shape);
}

}  // namespace te::nn
