// MXFP8BlockScaling (TE's recipe; the OCP Microscaling Formats v1.0 MXFP8 types): FP8 codes with
// one E8M0 power-of-two scale per 32 consecutive elements along the dim a GEMM contracts, and the
// recipe that casts a GEMM's operands that way.
//
// Definitions, from NVIDIA/TransformerEngine d0067d0da6cb01811b8072a7d304f0e00344ce2b:
// - the recipe: transformer_engine/common/recipe/__init__.py, class MXFP8BlockScaling (E4M3 by
//   default, HYBRID allowed; blocks of 32, "both versions [rowwise and columnwise] are computed
//   from the high precision input to avoid double quantization errors");
// - the cast: cast/mxfp8/quantize_mxfp8.cuh: a block's amax is fmaxf over |x| (NaN skipped), its
//   scale ptx::float_to_e8m0(amax * Quantized_Limits<OType>::max_norm_rcp) (max_norm_rcp =
//   1.0 / max_norm, utils.cuh), the codes static_cast<OType>(x * ptx::exp2f_rcp(scale))
//   (satfinite, round to nearest even); dequantize (mxfp8/dequantize_mxfp8.cuh): code * exp2f(e);
// - the block size: pytorch/constants.py MXFP8_BLOCK_SCALING_SIZE = 32. TE's MXFP8Quantizer
//   (pytorch/tensor/mxfp8_tensor.py is_quantizable) takes only dims that are multiples of 32; here
//   a shorter block at a ragged edge is scaled by its own elements, which is what zero padding to
//   32 would give (zeros change no amax).
// The E8M0 rules themselves are in te/kernels/fp8_cast.h.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include "te/runtime/parallel.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "on_device.h"
#include "recipe_impl.h"
#include "te/error.h"

namespace te::fp8 {

namespace {
constexpr int64_t kMxBlock = 32;
}  // namespace

Fp8Tensor quantize_mx(const at::Tensor& x_in, DType dtype) {
  check_blocked(x_in, ScalingMode::kBlock1x32, "quantize_mx", /*mx=*/true);
  TE_CHECK(at::isFloatingType(x_in.scalar_type()), "fp8::quantize_mx: cannot cast a ",
           x_in.scalar_type(), " tensor to MXFP8; give a floating-point tensor");
  at::NoGradGuard no_grad;
  const at::Tensor x = x_in.detach().to(at::kFloat).contiguous();
  const int64_t rows = x.size(0), cols = x.size(1), nb = (cols + kMxBlock - 1) / kMxBlock;
  Fp8Tensor out;
  out.dtype = dtype;
  out.scaling = ScalingMode::kBlock1x32;
  out.data = at::empty({rows, cols}, x.options().dtype(at::kByte));
  out.scale_inv = at::empty({rows, nb}, x.options().dtype(at::kByte));
  if (x.is_meta() || x.numel() == 0) return out;
  const float* in = x.data_ptr<float>();
  uint8_t* codes = out.data.data_ptr<uint8_t>();
  uint8_t* scales = out.scale_inv.data_ptr<uint8_t>();
#ifdef TE_WITH_CUDA
  if (x.is_cuda()) {
    const OnDevice on(x);
    cuda::quantize_mx(in, codes, scales, rows, cols, kernel_format(dtype), on.stream());
    return out;
  }
#endif
  const float max_norm_rcp = static_cast<float>(1.0 / max_finite(dtype));
  at::parallel_for(0, rows, std::max<int64_t>(1, 32768 / cols), [&](int64_t begin, int64_t end) {
    // A row at a time: its blocks' amaxes, their scales, its codes.
    std::vector<float> amax(static_cast<std::size_t>(nb)), factor(amax.size());
    for (int64_t r = begin; r < end; ++r) {
      std::fill(amax.begin(), amax.end(), 0.0f);
      fold_block_amaxes(in + r * cols, cols, kMxBlock, amax.data());
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t e = e8m0_round_up(amax[b] * max_norm_rcp);
        scales[r * nb + b] = e;
        factor[b] = e8m0_reciprocal(e);
      }
      quantize_blocks_row(in + r * cols, codes + r * cols, cols, kMxBlock, factor.data(), dtype);
    }
  });
  return out;
}

namespace {

class Mxfp8 final : public RecipeImpl {
 public:
  explicit Mxfp8(MXFP8BlockScaling r) : r_(r) {}

  std::string name() const override { return "mxfp8"; }
  Format format() const override { return r_.fp8_format; }
  std::string to_string() const override {
    std::ostringstream os;
    os << "MXFP8BlockScaling(format=" << format_name(r_.fp8_format) << ", blocks=1x32 E8M0)";
    return os.str();
  }

  // Every operand blocked along the dim its GEMM contracts, each cast from the high-precision
  // tensor: x and w^T for the forward GEMM, x^T for wgrad, w for dgrad.
  ForwardCasts cast_forward(const at::Tensor& x, const at::Tensor& w, GemmCall&) const override {
    const DType dtype = forward_dtype(r_.fp8_format);
    return {quantize_mx(x, dtype), quantize_mx(w.t(), dtype), quantize_mx(x.t(), dtype),
            quantize_mx(w, dtype)};
  }

  GradCasts cast_grad(const at::Tensor& g, GemmCall&) const override {
    const DType dtype = backward_dtype(r_.fp8_format);
    return {quantize_mx(g, dtype), quantize_mx(g.t(), dtype)};
  }

  bool fast_forward_accumulation() const override { return false; }

 private:
  MXFP8BlockScaling r_;
};

}  // namespace

std::shared_ptr<const RecipeImpl> implement(const MXFP8BlockScaling& r) {
  return std::make_shared<Mxfp8>(r);
}

}  // namespace te::fp8
