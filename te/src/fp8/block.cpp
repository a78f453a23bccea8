// Float8BlockScaling (TE's recipe, DeepSeek-V3's scaling): FP8 tensors scaled per 1x128 block or
// 128x128 tile, and the recipe that casts a GEMM's operands that way.
//
// Definitions, from NVIDIA/TransformerEngine d0067d0da6cb01811b8072a7d304f0e00344ce2b:
// - the recipe's settings: transformer_engine/common/recipe/__init__.py, class Float8BlockScaling
//   (E4M3, power-of-two scales, amax_epsilon 0, x and grad 1D blocks, w 2D blocks, split
//   accumulation in every GEMM);
// - a block's amax: fmaxf over |x| (transpose/quantize_transpose_{vector,square}_blockwise.cu),
//   so a NaN element is skipped by the amax and casts to NaN; its scale:
//   compute_scale_from_types -> compute_scale_from_amax (recipe/recipe_common.cuh) with
//   value_for_inf = the input type's max (fp32 here); codes static_cast<fp8>(x * scale), which
//   saturates (satfinite) and rounds to nearest even; scale_inv = 1 / scale;
// - ragged edges: zero padding (tests/pytorch/references/blockwise_quantizer_reference.py), which
//   changes no amax, so a short block is scaled by its own elements.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include "te/runtime/parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>
#include <vector>

#include "on_device.h"
#include "recipe_impl.h"
#include "te/error.h"

namespace te::fp8 {

namespace {

constexpr int64_t kBlock = 128;

int64_t blocks_of(int64_t n, int64_t width = kBlock) { return (n + width - 1) / width; }

}  // namespace

void check_blocked(const at::Tensor& x, ScalingMode scaling, const char* what, bool mx) {
  if (mx) {
    TE_CHECK(scaling != ScalingMode::kTensor && !is_nvfp4(scaling), "fp8::", what,
             ": scaling mode '", to_string(scaling),
             "' is not an FP8 block mode (1x32, 1x128, "
             "128x128)");
  } else {
    TE_CHECK(scaling == ScalingMode::kBlock1x128 || scaling == ScalingMode::kBlock128x128,
             "fp8::", what, ": scaling mode '", to_string(scaling),
             "' is not a block mode of Float8BlockScaling (1x128, 128x128)",
             scaling == ScalingMode::kBlock1x32 ? "; MXFP8's 1x32 blocks: quantize_mx" : "");
  }
  check_block_input(x, what);
}

void check_block_input(const at::Tensor& x, const char* what) {
  TE_CHECK(x.dim() == 2, "fp8::", what, ": a ", x.sizes(),
           " tensor; block scaling takes a 2-D tensor [rows, cols] (blocks along cols)");
#ifndef TE_WITH_CUDA
  if (x.is_cuda()) no_cuda(what);
#endif
  TE_CHECK(x.is_cpu() || x.is_cuda() || x.is_meta(), "fp8::", what, ": a tensor on ", x.device(),
           "; block scaling runs on the CPU and on CUDA devices");
}

Fp8Tensor quantize_blocks(const at::Tensor& x_in, ScalingMode scaling, DType dtype, bool power_2,
                          float epsilon) {
  check_blocked(x_in, scaling, "quantize_blocks", /*mx=*/false);
  TE_CHECK(at::isFloatingType(x_in.scalar_type()), "fp8::quantize_blocks: cannot cast a ",
           x_in.scalar_type(), " tensor to FP8; give a floating-point tensor");
  at::NoGradGuard no_grad;
  const at::Tensor x = x_in.detach().to(at::kFloat).contiguous();
  const int64_t rows = x.size(0), cols = x.size(1), nb = blocks_of(cols);
  const bool tiles = scaling == ScalingMode::kBlock128x128;
  Fp8Tensor out;
  out.dtype = dtype;
  out.scaling = scaling;
  out.data = at::empty({rows, cols}, x.options().dtype(at::kByte));
  out.scale_inv = at::empty({tiles ? blocks_of(rows) : rows, nb}, x.options());
  if (x.is_meta() || x.numel() == 0) {
    if (!x.is_meta()) out.scale_inv.fill_(1.0f);
    return out;
  }
  const float* in = x.data_ptr<float>();
  uint8_t* codes = out.data.data_ptr<uint8_t>();
  float* scale_inv = out.scale_inv.data_ptr<float>();
#ifdef TE_WITH_CUDA
  if (x.is_cuda()) {
    const OnDevice on(x);
    cuda::quantize_blocks(in, codes, scale_inv, rows, cols, tiles ? kBlock : 1,
                          kernel_format(dtype), power_2, epsilon, on.stream());
    return out;
  }
#endif
  const float fp8_max = max_finite(dtype);
  // One block row at a time (a row of 1x128 blocks, or 128 rows of 128x128 tiles): the blocks'
  // amaxes, a row per kernel call, then their scales, then the codes, a row per call again.
  const int64_t band = tiles ? kBlock : 1;
  at::parallel_for(0, out.scale_inv.size(0), tiles ? 1 : 64, [&](int64_t begin, int64_t end) {
    std::vector<float> amax(static_cast<std::size_t>(nb)), scale(amax.size());
    for (int64_t br = begin; br < end; ++br) {
      const int64_t r0 = br * band, r1 = std::min(rows, r0 + band);
      std::fill(amax.begin(), amax.end(), 0.0f);
      for (int64_t r = r0; r < r1; ++r) fold_block_amaxes(in + r * cols, cols, kBlock, amax.data());
      for (int64_t b = 0; b < nb; ++b) {
        scale[b] = scale_from_amax(amax[b], fp8_max, power_2, epsilon);
        scale_inv[br * nb + b] = 1.0f / scale[b];
      }
      for (int64_t r = r0; r < r1; ++r) {
        quantize_blocks_row(in + r * cols, codes + r * cols, cols, kBlock, scale.data(), dtype);
      }
    }
  });
  return out;
}

Fp8Tensor transpose_tiles(const Fp8Tensor& t) {
  TE_CHECK(t.scaling == ScalingMode::kBlock128x128 || t.scaling == ScalingMode::kBlock16x16,
           "fp8::transpose_tiles: scaling mode '", to_string(t.scaling),
           "'; only square tiles (128x128, NVFP4's 16x16) transpose into tiles of the transpose");
  if (t.scaling == ScalingMode::kBlock128x128) {
    return {t.data.t().contiguous(), t.scale_inv.t().contiguous(), t.dtype, t.scaling};
  }
  // NVFP4: the E2M1 codes unpacked (element 2k in the low nibble), transposed, packed again; the
  // tensor amax stays.
  const int64_t rows = t.data.size(0), cols = t.data.size(1) * 2;
  TE_CHECK(rows % 2 == 0, "fp8::transpose_tiles: NVFP4 codes of ", rows,
           " rows; their transpose packs two codes a byte along them, so the rows must be even");
  const at::Tensor codes =
      at::stack({at::bitwise_and(t.data, 0x0F), at::bitwise_right_shift(t.data, 4)}, -1)
          .reshape({rows, cols})
          .t()
          .contiguous()
          .reshape({cols, rows / 2, 2});
  const at::Tensor packed =
      at::bitwise_or(codes.select(-1, 0), at::bitwise_left_shift(codes.select(-1, 1), 4));
  Fp8Tensor out{packed.contiguous(), t.scale_inv.t().contiguous(), t.dtype, t.scaling};
  out.amax = t.amax;
  return out;
}

at::Tensor dequantize_blocks(const Fp8Tensor& t) {
  check_blocked(t.data, t.scaling, "dequantize", /*mx=*/true);
  const at::Tensor codes = t.data.contiguous();
  const bool mx = t.scaling == ScalingMode::kBlock1x32;
  const bool tiles = t.scaling == ScalingMode::kBlock128x128;
  const int64_t width = mx ? 32 : kBlock;
  const int64_t rows = codes.size(0), cols = codes.size(1), nb = blocks_of(cols, width);
  const std::vector<int64_t> want{tiles ? blocks_of(rows) : rows, nb};
  const at::ScalarType scale_type = mx ? at::kByte : at::kFloat;
  TE_CHECK(t.scale_inv.defined() && t.scale_inv.scalar_type() == scale_type &&
               t.scale_inv.sizes() == at::IntArrayRef(want),
           "fp8::dequantize: scale_inv ",
           t.scale_inv.defined() ? t.scale_inv.sizes() : at::IntArrayRef{}, " for ", codes.sizes(),
           " codes in ", to_string(t.scaling), " blocks; it must be ",
           mx ? "E8M0 (uint8) " : "fp32 ", at::IntArrayRef(want));
  TE_CHECK(t.scale_inv.device() == codes.device(), "fp8::dequantize: scale_inv is on ",
           t.scale_inv.device(), " but the codes on ", codes.device(),
           "; keep the scales with the codes they scale");
  at::Tensor out = at::empty({rows, cols}, codes.options().dtype(at::kFloat));
  if (codes.is_meta() || codes.numel() == 0) return out;
  at::Tensor s = t.scale_inv.contiguous();
  if (mx && !codes.is_cuda()) {  // the E8M0 powers of two as fp32 (exact)
    at::Tensor f = at::empty(s.sizes(), s.options().dtype(at::kFloat));
    const uint8_t* e = s.data_ptr<uint8_t>();
    float* v = f.data_ptr<float>();
    for (int64_t i = 0; i < s.numel(); ++i) v[i] = e8m0_to_float(e[i]);
    s = f;
  }
#ifdef TE_WITH_CUDA
  if (codes.is_cuda()) {
    const OnDevice on(codes);
    if (mx) {
      cuda::dequantize_mx(codes.data_ptr<uint8_t>(), s.data_ptr<uint8_t>(), out.data_ptr<float>(),
                          rows, cols, kernel_format(t.dtype), on.stream());
    } else {
      cuda::dequantize_blocks(codes.data_ptr<uint8_t>(), s.data_ptr<float>(), out.data_ptr<float>(),
                              rows, cols, tiles ? kBlock : 1, kBlock, kernel_format(t.dtype),
                              on.stream());
    }
    return out;
  }
#endif
  const uint8_t* in = codes.data_ptr<uint8_t>();
  const float* scale_inv = s.data_ptr<float>();
  float* o = out.data_ptr<float>();
  // The codes' exact values (one lookup table per chunk), then each block times its scale_inv:
  // the same one fp32 product per element as a table of scaled values, without a table per block.
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    fp8::dequantize(in + begin * cols, o + begin * cols, (end - begin) * cols, 1.0f, t.dtype);
    for (int64_t r = begin; r < end; ++r) {
      const float* row_scales = scale_inv + (tiles ? r / kBlock : r) * nb;
      float* row = o + r * cols;
      for (int64_t b = 0; b < nb; ++b) {
        const float s = row_scales[b];
        for (int64_t c = b * width, e = std::min(cols, c + width); c < e; ++c) row[c] *= s;
      }
    }
  });
  return out;
}

namespace {

class Block final : public RecipeImpl {
 public:
  explicit Block(Float8BlockScaling r) : r_(r) {}

  std::string name() const override { return "block"; }
  Format format() const override { return r_.fp8_format; }
  std::string to_string() const override {
    std::ostringstream os;
    os << "Float8BlockScaling(format=" << format_name(r_.fp8_format)
       << ", power_2_scales=" << (r_.power_2_scales ? "true" : "false")
       << ", amax_epsilon=" << r_.amax_epsilon << ", x=1x128, w=128x128, grad=1x128)";
    return os.str();
  }

  // Each layout cast from the high-precision tensor with its own blocks (TE: "both versions are
  // computed from the high precision input to avoid double quantization errors"); a weight's
  // square tiles serve both layouts.
  ForwardCasts cast_forward(const at::Tensor& x, const at::Tensor& w, GemmCall&) const override {
    const DType dtype = forward_dtype(r_.fp8_format);
    Fp8Tensor w_t = cast(w.t(), ScalingMode::kBlock128x128, dtype);
    Fp8Tensor w_tiles = transpose_tiles(w_t);
    return {cast(x, ScalingMode::kBlock1x128, dtype), std::move(w_t),
            cast(x.t(), ScalingMode::kBlock1x128, dtype), std::move(w_tiles)};
  }

  GradCasts cast_grad(const at::Tensor& g, GemmCall&) const override {
    const DType dtype = backward_dtype(r_.fp8_format);
    return {cast(g, ScalingMode::kBlock1x128, dtype), cast(g.t(), ScalingMode::kBlock1x128, dtype)};
  }

  bool fast_forward_accumulation() const override { return false; }

 private:
  Fp8Tensor cast(const at::Tensor& x, ScalingMode scaling, DType dtype) const {
    return quantize_blocks(x, scaling, dtype, r_.power_2_scales, r_.amax_epsilon);
  }

  Float8BlockScaling r_;
};

}  // namespace

std::shared_ptr<const RecipeImpl> implement(const Float8BlockScaling& r) {
  check_amax_epsilon("Float8BlockScaling", r.amax_epsilon);
  return std::make_shared<Block>(r);
}

}  // namespace te::fp8
