// NVFP4BlockScaling (TE's recipe): E2M1 codes with an E4M3 scale per 16 elements and an FP32
// tensor scale, 16x16 tiles for weights, the random Hadamard transform on the wgrad operands and
// stochastic rounding for gradients; the CPU reference of the casts and the recipe.
//
// Definitions, from NVIDIA/TransformerEngine d0067d0da6cb01811b8072a7d304f0e00344ce2b:
// - the recipe: transformer_engine/common/recipe/__init__.py, class NVFP4BlockScaling (inputs:
//   RHT, no SR, 1-D blocks; weights: 16x16 blocks, no RHT, no SR; gradients: RHT and SR, 1-D;
//   "RHT is currently only applied to column-wise usage so that it can be used for wgrad GEMM");
// - the tensor scale: cast/nvfp4/core_nvfp4.cuh compute_global_encode_scaling_factor_FP4
//   (S_enc = 448 * 6 / amax, fminf with FLT_MAX, 1 when the amax is 0 or S_enc is 0);
// - a block's scale: core_nvfp4.cuh compute_decoding_scaling_factor (block_amax * (S_enc *
//   (1 / 6)), fminf with FLT_MAX, static_cast to E4M3: satfinite, RNE); a block's amax fmaxf over
//   |x| (quantize_transpose_nvfp4.cuh), so NaN is skipped;
// - the codes: quantize_transpose_nvfp4.cuh block_scale_inverse = fminf(1 / (float(s) *
//   S_dec), FLT_MAX) with S_dec = 1 / S_enc, then util/ptx_arch_spec.cuh mul_cvt_fp32_to_fp4_4x
//   (an fp32 multiply, cvt.rn.satfinite.e2m1x2.f32; cvt.rs for stochastic rounding);
// - dequantize: cast/nvfp4/dequantize_nvfp4.cuh (code * (float(s) * amax * (1 / (6 * 448))));
// - the transform: pytorch/custom_recipes/reference_nvfp4.py (_build_hadamard_matrix,
//   get_wgrad_sign_vector, _apply_rht: x @ (D H) / sqrt(16) along the last dim of the
//   transposed tensor, its amax taken after the transform).
// TE's kernels take bf16 input and round the transform to bf16; here every step is fp32.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include "te/runtime/parallel.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <sstream>
#include <vector>

#include "on_device.h"
#include "recipe_impl.h"
#include "te/error.h"
#include "te/kernels/fp4_cast.h"
#include "te/kernels/philox.h"

namespace te::fp8 {

namespace {

constexpr int64_t kNvBlock = 16;

int64_t blocks16(int64_t n) { return (n + kNvBlock - 1) / kNvBlock; }

void check_nvfp4_mode(ScalingMode scaling, const char* what) {
  TE_CHECK(is_nvfp4(scaling), "fp8::", what, ": scaling mode '", to_string(scaling),
           "' is not one of NVFP4's (1x16, 16x16)");
}

// The Philox words of consecutive elements (dropout_word's mapping), a 4-word block per 4.
class Draws {
 public:
  Draws(uint64_t seed, uint64_t call) : seed_(seed), call_(call) {}

  uint32_t word(uint64_t g) {
    if (g / 4 != block_) {
      block_ = g / 4;
      words_ = kernels::dropout_words(block_, seed_, call_);
    }
    return words_[g % 4];
  }

 private:
  uint64_t seed_, call_;
  uint64_t block_ = ~uint64_t{0};
  std::array<uint32_t, 4> words_{};
};

}  // namespace

namespace {

// The CPU cast of a contiguous fp32 [rows, cols] into `out` (its tensors allocated): the 1x16
// blocks of each row, or 16x16 tiles.
void quantize_nvfp4_cpu(const float* in, int64_t rows, int64_t cols, bool tiles,
                        const Nvfp4Cast& how, Fp8Tensor& out) {
  const int64_t nb = blocks16(cols);
  const int64_t band = tiles ? kNvBlock : 1, bands = out.scale_inv.size(0);
  const int64_t grain = tiles ? 1 : 64;
  // The tensor scale needs the whole tensor's amax before any block's scale. Given it (the
  // recipe's, reduced over ranks), one pass: each band's block amaxes (a row of 1x16 blocks, or
  // 16 rows of 16x16 tiles; fold_amax's rule, NaN skipped), their scales and its codes while the
  // band is in cache. Otherwise a first pass keeps every band's block amaxes and, from them, the
  // tensor amax (never NaN, so the max of the bands').
  std::vector<float> band_amax;
  const auto fold_band = [&](int64_t br, float* amaxes) {
    std::fill(amaxes, amaxes + nb, 0.0f);
    for (int64_t r = br * band, r1 = std::min(rows, r + band); r < r1; ++r) {
      fold_block_amaxes(in + r * cols, cols, kNvBlock, amaxes);
    }
  };
  float tensor_amax = 0.0f;
  if (!how.amax) {
    band_amax.resize(static_cast<std::size_t>(bands * nb));
    tensor_amax = at::parallel_reduce(
        0, bands, grain, 0.0f,
        [&](int64_t begin, int64_t end, float acc) {
          for (int64_t br = begin; br < end; ++br) {
            fold_band(br, band_amax.data() + br * nb);
            acc = fold_amax(band_amax.data() + br * nb, nb, acc);
          }
          return acc;
        },
        [](float a, float b) { return std::max(a, b); });
  }
  const float amax = how.amax ? *how.amax : tensor_amax;
  out.amax.fill_(amax);
  if (rows * cols == 0) return;
  uint8_t* packed = out.data.data_ptr<uint8_t>();
  uint8_t* scales = out.scale_inv.data_ptr<uint8_t>();
  const float s_enc = nvfp4_encode_scale(amax);
  const float s_dec = 1.0f / s_enc;
  const float block_factor = s_enc * (1.0f / kE2M1Max);
  at::parallel_for(0, bands, grain, [&](int64_t begin, int64_t end) {
    Draws draws(how.seed, how.call);
    std::vector<float> encode(static_cast<std::size_t>(nb)), own(band_amax.empty() ? nb : 0);
    for (int64_t br = begin; br < end; ++br) {
      const int64_t r0 = br * band, r1 = std::min(rows, r0 + band);
      const float* amaxes = own.data();
      if (band_amax.empty()) {
        fold_band(br, own.data());
      } else {
        amaxes = band_amax.data() + br * nb;
      }
      nvfp4_block_scales(amaxes, nb, block_factor, s_dec, scales + br * nb, encode.data());
      for (int64_t r = r0; r < r1; ++r) {
        uint8_t* dst = packed + r * (cols / 2);
        if (!how.stochastic) {
          nvfp4_quantize_row(in + r * cols, dst, cols, encode.data());
          continue;
        }
        const uint64_t g = static_cast<uint64_t>(r * cols);
        for (int64_t c = 0; c < cols; c += 2) {
          const float s = encode[static_cast<std::size_t>(c / kNvBlock)];
          const uint8_t lo = e2m1_round_stochastic(in[r * cols + c] * s, draws.word(g + c));
          const uint8_t hi = e2m1_round_stochastic(in[r * cols + c + 1] * s, draws.word(g + c + 1));
          dst[c / 2] = static_cast<uint8_t>(lo | (hi << 4));
        }
      }
    }
  });
}

}  // namespace

Fp8Tensor quantize_nvfp4(const at::Tensor& x_in, const Nvfp4Cast& how) {
  check_nvfp4_mode(how.scaling, "quantize_nvfp4");
  check_block_input(x_in, "quantize_nvfp4");
  TE_CHECK(at::isFloatingType(x_in.scalar_type()), "fp8::quantize_nvfp4: cannot cast a ",
           x_in.scalar_type(), " tensor to NVFP4; give a floating-point tensor");
  TE_CHECK(x_in.size(1) % 2 == 0, "fp8::quantize_nvfp4: a ", x_in.sizes(),
           " tensor has an odd number of columns (", x_in.size(1),
           "); NVFP4 packs two E2M1 codes a byte along the columns (TE takes multiples of 16)");
  at::NoGradGuard no_grad;
  const at::Tensor x = x_in.detach().to(at::kFloat).contiguous();
  const int64_t rows = x.size(0), cols = x.size(1), nb = blocks16(cols);
  const bool tiles = how.scaling == ScalingMode::kBlock16x16;
  Fp8Tensor out;
  out.dtype = DType::kE4M3;
  out.scaling = how.scaling;
  out.data = at::empty({rows, cols / 2}, x.options().dtype(at::kByte));
  out.scale_inv = at::empty({tiles ? blocks16(rows) : rows, nb}, x.options().dtype(at::kByte));
  out.amax = at::empty({1}, x.options());
  if (x.is_meta()) return out;
  const float* in = x.data_ptr<float>();
#ifdef TE_WITH_CUDA
  if (x.is_cuda()) {
    // The tensor amax stays on the device: given, or folded there (NaN skipped).
    const OnDevice on(x);
    if (how.amax) {
      out.amax.fill_(*how.amax);
    } else {
      out.amax.zero_();
      cuda::fold_amax(in, x.numel(), out.amax.data_ptr<float>(), on.stream());
    }
    cuda::quantize_nvfp4(in, out.data.data_ptr<uint8_t>(), out.scale_inv.data_ptr<uint8_t>(), rows,
                         cols, tiles ? kNvBlock : 1, out.amax.data_ptr<float>(), how.stochastic,
                         how.seed, how.call, on.stream());
    return out;
  }
#endif
  quantize_nvfp4_cpu(in, rows, cols, tiles, how, out);
  return out;
}

at::Tensor dequantize_nvfp4(const Fp8Tensor& t) {
  check_nvfp4_mode(t.scaling, "dequantize");
  const at::Tensor packed = t.data.contiguous();
  check_block_input(packed, "dequantize");
  const int64_t rows = packed.size(0), cols = packed.size(1) * 2, nb = blocks16(cols);
  const bool tiles = t.scaling == ScalingMode::kBlock16x16;
  const std::vector<int64_t> want{tiles ? blocks16(rows) : rows, nb};
  TE_CHECK(t.scale_inv.defined() && t.scale_inv.scalar_type() == at::kByte &&
               t.scale_inv.sizes() == at::IntArrayRef(want),
           "fp8::dequantize: scale_inv ",
           t.scale_inv.defined() ? t.scale_inv.sizes() : at::IntArrayRef{}, " for ", packed.sizes(),
           " packed E2M1 codes in ", to_string(t.scaling), " blocks; it must be E4M3 (uint8) ",
           at::IntArrayRef(want));
  TE_CHECK(t.amax.defined() && t.amax.numel() == 1 && t.amax.scalar_type() == at::kFloat,
           "fp8::dequantize: an NVFP4 tensor needs its amax (fp32, one element), the second "
           "level of its scaling");
  TE_CHECK(t.scale_inv.device() == packed.device() && t.amax.device() == packed.device(),
           "fp8::dequantize: NVFP4 codes on ", packed.device(), " with scale_inv on ",
           t.scale_inv.device(), " and amax on ", t.amax.device(),
           "; keep the scales with the codes they scale");
  at::Tensor out = at::empty({rows, cols}, packed.options().dtype(at::kFloat));
  if (packed.is_meta() || packed.numel() == 0) return out;
#ifdef TE_WITH_CUDA
  if (packed.is_cuda()) {
    const OnDevice on(packed);
    const at::Tensor scales_c = t.scale_inv.contiguous();
    cuda::dequantize_nvfp4(packed.data_ptr<uint8_t>(), scales_c.data_ptr<uint8_t>(),
                           t.amax.data_ptr<float>(), out.data_ptr<float>(), rows, cols,
                           tiles ? kNvBlock : 1, on.stream());
    return out;
  }
#endif
  const float amax = t.amax.item<float>();
  const uint8_t* in = packed.data_ptr<uint8_t>();
  const at::Tensor scales_c = t.scale_inv.contiguous();
  const uint8_t* scales = scales_c.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  constexpr float factor_inv = 1.0f / kNvfp4Max;
  at::parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* row_scales = scales + (tiles ? r / kNvBlock : r) * nb;
      for (int64_t b = 0; b < nb; ++b) {
        const float final_scale = cast_from_fp8(row_scales[b], DType::kE4M3) * amax * factor_inv;
        for (int64_t c = b * kNvBlock, e = std::min(cols, c + kNvBlock); c < e; c += 2) {
          const uint8_t byte = in[r * (cols / 2) + c / 2];
          o[r * cols + c] = e2m1_to_float(byte & 0xF) * final_scale;
          o[r * cols + c + 1] = e2m1_to_float(static_cast<uint8_t>(byte >> 4)) * final_scale;
        }
      }
    }
  });
  return out;
}

at::Tensor hadamard16(const at::Tensor& x_in) {
  check_block_input(x_in, "hadamard16");
  TE_CHECK(at::isFloatingType(x_in.scalar_type()), "fp8::hadamard16: a ", x_in.scalar_type(),
           " tensor; give a floating-point tensor");
  at::NoGradGuard no_grad;
  const int64_t rows = x_in.size(0), cols = x_in.size(1), padded = blocks16(cols) * kNvBlock;
  at::Tensor x = x_in.detach().to(at::kFloat);
  if (padded != cols) x = at::constant_pad_nd(x, {0, padded - cols});
  x = x.contiguous();
  at::Tensor out = at::empty({rows, padded}, x.options());
  if (x.is_meta() || x.numel() == 0) return out;
#ifdef TE_WITH_CUDA
  if (x.is_cuda()) {
    const OnDevice on(x);
    cuda::hadamard16(x.data_ptr<float>(), out.data_ptr<float>(), rows, padded, on.stream());
    return out;
  }
#endif
  // D H / 4 (hadamard16_entry), each output the sum over i in order.
  std::array<float, kNvBlock * kNvBlock> m{};
  for (int i = 0; i < kNvBlock; ++i) {
    for (int j = 0; j < kNvBlock; ++j) m[i * kNvBlock + j] = hadamard16_entry(i, j);
  }
  const float* in = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows * (padded / kNvBlock), 1024, [&](int64_t begin, int64_t end) {
    for (int64_t blk = begin; blk < end; ++blk) {
      const float* v = in + blk * kNvBlock;
      float* w = o + blk * kNvBlock;
      for (int j = 0; j < kNvBlock; ++j) {
        float acc = 0.0f;
        for (int i = 0; i < kNvBlock; ++i) acc += v[i] * m[i * kNvBlock + j];
        w[j] = acc;
      }
    }
  });
  return out;
}

namespace {

class Nvfp4 final : public RecipeImpl {
 public:
  explicit Nvfp4(NVFP4BlockScaling r) : r_(r) {}

  std::string name() const override { return "nvfp4"; }
  Format format() const override { return Format::kE4M3; }  // the block scales' (TE: fp8_format)
  std::string to_string() const override {
    std::ostringstream os;
    os << "NVFP4BlockScaling(x=1x16" << (r_.disable_rht ? "" : ", x^T=RHT+1x16")
       << ", w=" << (r_.disable_2d_quantization ? "1x16" : "16x16")
       << ", grad=" << (r_.disable_stochastic_rounding ? "1x16" : "SR+1x16")
       << (r_.disable_rht ? "" : ", grad^T=RHT") << ", seed=" << r_.seed << ")";
    return os.str();
  }

  // x [M, K] and w^T [N, K] for the forward GEMM, x^T [K, M] (transformed along M) for wgrad,
  // w [K, N] for dgrad; each from the high-precision tensor.
  ForwardCasts cast_forward(const at::Tensor& x, const at::Tensor& w,
                            GemmCall& call) const override {
    const ScalingMode weights =
        r_.disable_2d_quantization ? ScalingMode::kBlock1x16 : ScalingMode::kBlock16x16;
    const std::optional<float> w_amax = amax_of(w, call);
    Fp8Tensor w_t = cast_as(w.t(), weights, w_amax, false);
    // 16x16 tiles: w's are w^T's transposed, the same codes (one cast of the kernel, not two).
    Fp8Tensor w_codes = weights == ScalingMode::kBlock16x16 && w.size(1) % 2 == 0 && !w.is_meta()
                            ? transpose_tiles(w_t)
                            : cast_as(w, weights, w_amax, false);
    return {cast(x, ScalingMode::kBlock1x16, call, false), std::move(w_t),
            cast(wgrad_operand(x.t()), ScalingMode::kBlock1x16, call, false), std::move(w_codes)};
  }

  // g [M, N] for dgrad, g^T [N, M] (transformed along M) for wgrad.
  GradCasts cast_grad(const at::Tensor& g, GemmCall& call) const override {
    const bool sr = !r_.disable_stochastic_rounding;
    return {cast(g, ScalingMode::kBlock1x16, call, sr),
            cast(wgrad_operand(g.t()), ScalingMode::kBlock1x16, call, sr)};
  }

  bool fast_forward_accumulation() const override { return false; }

 private:
  at::Tensor wgrad_operand(const at::Tensor& t) const { return r_.disable_rht ? t : hadamard16(t); }

  // The whole tensor's amax (reduced over the mesh); none for shapes alone (the planner's dry run).
  static std::optional<float> amax_of(const at::Tensor& x, const GemmCall& call) {
    const at::Tensor a = reduced_amax(x, call);
    if (a.is_meta()) return std::nullopt;
    return a.item<float>();
  }

  Fp8Tensor cast(const at::Tensor& x, ScalingMode scaling, const GemmCall& call,
                 bool stochastic) const {
    return cast_as(x, scaling, amax_of(x, call), stochastic);
  }

  Fp8Tensor cast_as(const at::Tensor& x, ScalingMode scaling, std::optional<float> amax,
                    bool stochastic) const {
    Nvfp4Cast how;
    how.scaling = scaling;
    how.amax = amax;
    how.stochastic = stochastic;
    if (stochastic) {
      how.seed = r_.seed;
      how.call = draws_.fetch_add(1, std::memory_order_relaxed);
    }
    return quantize_nvfp4(x, how);
  }

  NVFP4BlockScaling r_;
  mutable std::atomic<uint64_t> draws_{0};  // the stochastic casts made: each one's Philox call
};

}  // namespace

std::shared_ptr<const RecipeImpl> implement(const NVFP4BlockScaling& r) {
  return std::make_shared<Nvfp4>(r);
}

}  // namespace te::fp8
