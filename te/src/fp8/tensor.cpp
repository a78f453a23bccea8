// FP8 tensors: casts, amax and the GEMM, on CPU (the reference) and CUDA.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include "te/runtime/parallel.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <optional>

#include "on_device.h"
#include "recipe_impl.h"
#include "te/error.h"
#include "te/fp8.h"

namespace te::fp8 {

namespace {

constexpr int64_t kGrain = 1 << 16;

// NaN wins; otherwise the larger.
float max_amax(float a, float b) { return std::isnan(a) || a > b ? a : b; }

void check_scale(const at::Tensor& t, const char* what, const at::Tensor& x) {
  TE_CHECK(t.defined() && t.numel() == 1 && t.scalar_type() == at::kFloat, "fp8: ", what,
           " must be an fp32 tensor of one element");
  TE_CHECK(t.device() == x.device(), "fp8: ", what, " is on ", t.device(), " but the data on ",
           x.device(), "; keep the FP8 state with the tensors it scales");
}

at::Tensor as_float(const at::Tensor& x) {
  TE_CHECK(at::isFloatingType(x.scalar_type()), "fp8: cannot cast a ", x.scalar_type(),
           " tensor to FP8; give a floating-point tensor");
  return x.to(at::kFloat).contiguous();
}

#ifdef TE_WITH_CUDA
// The CUDA kernels' element type for a dtype they read or write as it is (fp32, bf16, fp16).
std::optional<cuda::Real> real_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return cuda::kFloat32;
    case at::kBFloat16:
      return cuda::kBFloat16;
    case at::kHalf:
      return cuda::kFloat16;
    default:
      return std::nullopt;
  }
}
#endif

// A cast's input as the kernels read it: on CUDA fp32, bf16 and fp16 as they are (a bf16
// activation is not widened in memory first), anything else and CPU tensors as fp32.
at::Tensor cast_input(const at::Tensor& x) {
#ifdef TE_WITH_CUDA
  if (x.is_cuda() && real_of(x.scalar_type())) return x.contiguous();
#endif
  return as_float(x);
}

// out = value(codes) * scale_inv, in parallel chunks (contiguous CPU tensors of one shape).
void decode(const at::Tensor& codes, const at::Tensor& out, float scale_inv, DType dtype) {
  const uint8_t* in = codes.data_ptr<uint8_t>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, codes.numel(), kGrain, [&](int64_t begin, int64_t end) {
    fp8::dequantize(in + begin, o + begin, end - begin, scale_inv, dtype);
  });
}

// The exact values of t's codes (no scale) as an fp32 tensor of t's shape in `scratch`'s memory.
at::Tensor decode_into(const Fp8Tensor& t, at::Tensor& scratch) {
  const at::Tensor codes = t.data.contiguous();
  // Each operand starts on a page boundary: with the two at some other offset apart, OpenBLAS's
  // sgemm ran at half speed at 1024^2 here (bench_fp8).
  constexpr int64_t kPage = 4096 / sizeof(float);
  if (!scratch.defined() || scratch.numel() < codes.numel() + kPage) {
    scratch = at::empty({codes.numel() + kPage}, at::kFloat);
  }
  const auto address = reinterpret_cast<uintptr_t>(scratch.data_ptr<float>());
  const int64_t skip = static_cast<int64_t>((4096 - address % 4096) % 4096 / sizeof(float));
  at::Tensor out = scratch.narrow(0, skip, codes.numel()).view(codes.sizes());
  decode(codes, out, 1.0f, t.dtype);
  return out;
}

}  // namespace

const char* to_string(ScalingMode mode) {
  switch (mode) {
    case ScalingMode::kTensor:
      return "tensor";
    case ScalingMode::kBlock1x128:
      return "1x128";
    case ScalingMode::kBlock128x128:
      return "128x128";
    case ScalingMode::kBlock1x32:
      return "1x32";
    case ScalingMode::kBlock1x16:
      return "1x16";
    case ScalingMode::kBlock16x16:
      return "16x16";
  }
  return "?";
}

at::Tensor Fp8Tensor::dequantize() const {
  TE_CHECK(data.defined() && data.scalar_type() == at::kByte,
           "Fp8Tensor::dequantize: the codes must be a uint8 tensor");
  if (is_nvfp4(scaling)) return dequantize_nvfp4(*this);
  if (scaling != ScalingMode::kTensor) return dequantize_blocks(*this);
  const at::Tensor codes = data.contiguous();
  check_scale(scale_inv, "Fp8Tensor::dequantize: scale_inv", codes);
  at::Tensor out = at::empty(codes.sizes(), codes.options().dtype(at::kFloat));
  if (codes.is_meta()) return out;  // shapes alone (te/runtime/meta.h)
  if (codes.is_cuda()) {
#ifdef TE_WITH_CUDA
    const OnDevice on(codes);
    cuda::dequantize(codes.data_ptr<uint8_t>(), out.data_ptr<float>(), codes.numel(),
                     scale_inv.data_ptr<float>(), kernel_format(dtype), on.stream());
    return out;
#else
    no_cuda("dequantize");
#endif
  }
  decode(codes, out, scale_inv.item<float>(), dtype);
  return out;
}

at::Tensor amax(const at::Tensor& x_in) {
  const at::Tensor x = as_float(x_in);
  if (x.numel() == 0) return at::zeros({1}, x.options());
  // max |x| with NaN propagating (at::max does).
  return x.abs().max().reshape({1});
}

Fp8Tensor quantize(const at::Tensor& x_in, const at::Tensor& scale, DType dtype,
                   const at::Tensor& amax) {
  const at::Tensor x = cast_input(x_in);
  check_scale(scale, "scale", x);
  if (amax.defined()) check_scale(amax, "amax", x);
  Fp8Tensor out;
  out.dtype = dtype;
  out.data = at::empty(x.sizes(), x.options().dtype(at::kByte));
  at::NoGradGuard no_grad;
  if (x.is_meta()) {  // shapes alone (te/runtime/meta.h): no codes, no amax
    out.scale_inv = at::reciprocal(scale);
    return out;
  }
  if (x.is_cuda()) {
#ifdef TE_WITH_CUDA
    out.scale_inv = at::reciprocal(scale);
    const OnDevice on(x);
    cuda::quantize(x.data_ptr(), *real_of(x.scalar_type()), out.data.data_ptr<uint8_t>(), x.numel(),
                   scale.data_ptr<float>(), amax.defined() ? amax.data_ptr<float>() : nullptr,
                   kernel_format(dtype), on.stream());
    return out;
#else
    no_cuda("quantize");
#endif
  }
  const float s = scale.item<float>();
  const float* in = x.data_ptr<float>();
  uint8_t* codes = out.data.data_ptr<uint8_t>();
  std::mutex mu;
  float top = 0.0f;
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t begin, int64_t end) {
    const float part = fp8::quantize(in + begin, codes + begin, end - begin, s, dtype);
    std::lock_guard<std::mutex> lock(mu);
    top = max_amax(top, part);
  });
  out.scale_inv = at::reciprocal(scale);
  if (amax.defined()) amax.fill_(max_amax(amax.item<float>(), top));
  return out;
}

Fp8Tensor quantize_to_own_scale(const at::Tensor& x, DType dtype) {
  at::NoGradGuard no_grad;
  const at::Tensor data = x.detach().to(at::kFloat).contiguous();
  const float scale = compute_scale(fp8::amax(data).item<float>(), 1.0f, max_finite(dtype), 0);
  return quantize(data, at::full({1}, scale, data.options()), dtype);
}

std::pair<at::Tensor, at::Tensor> quantize_rows(const at::Tensor& x_in, DType dtype) {
  TE_CHECK(x_in.dim() == 2, "fp8::quantize_rows: x has shape ", x_in.sizes(),
           "; it takes a 2-D tensor [rows, cols]");
  at::NoGradGuard no_grad;
  const at::Tensor x = x_in.detach().to(at::kFloat).contiguous();
  // compute_scale's fp32 operations, row by row: fp8_max / amax, 1 where that is not a scale.
  const at::Tensor row_amax =
      x.numel() == 0 ? at::zeros({x.size(0)}, x.options()) : std::get<0>(x.abs().max(1));
  const at::Tensor quotient = at::div(at::full_like(row_amax, max_finite(dtype)), row_amax);
  const at::Tensor scale =
      at::where((row_amax > 0) & at::isfinite(row_amax) & at::isfinite(quotient), quotient,
                at::ones_like(row_amax));
  // x * scale rounded once to fp32, then cast with scale 1: the same codes as casting each row
  // with its own scale.
  const Fp8Tensor q = quantize(x * scale.unsqueeze(1), at::ones({1}, x.options()), dtype);
  return {q.data, at::reciprocal(scale)};
}

at::Tensor dequantize_rows(const at::Tensor& codes, const at::Tensor& scale_inv, DType dtype) {
  TE_CHECK(codes.dim() >= 1 && scale_inv.dim() == codes.dim() - 1 &&
               scale_inv.sizes() == codes.sizes().slice(0, codes.dim() - 1),
           "fp8::dequantize_rows: codes ", codes.sizes(), " and scale_inv ", scale_inv.sizes(),
           " do not match; give one scale per row (codes [..., cols], scale_inv [...])");
  const Fp8Tensor unit{codes, at::ones({1}, scale_inv.options().dtype(at::kFloat)), dtype};
  return unit.dequantize().mul_(scale_inv.to(at::kFloat).unsqueeze(-1));
}

std::pair<Fp8Tensor, Fp8Tensor> cast_transpose(const at::Tensor& x, const at::Tensor& scale,
                                               DType dtype, const at::Tensor& amax) {
  TE_CHECK(x.dim() == 2, "fp8::cast_transpose: x has shape ", x.sizes(), "; it takes a 2-D tensor");
  if (x.is_cuda()) {
#ifdef TE_WITH_CUDA
    const at::Tensor xf = cast_input(x);
    check_scale(scale, "scale", xf);
    if (amax.defined()) check_scale(amax, "amax", xf);
    Fp8Tensor a{at::empty(xf.sizes(), xf.options().dtype(at::kByte)), at::reciprocal(scale), dtype};
    Fp8Tensor t{at::empty({xf.size(1), xf.size(0)}, xf.options().dtype(at::kByte)), a.scale_inv,
                dtype};
    const OnDevice on(xf);
    cuda::cast_transpose(xf.data_ptr(), *real_of(xf.scalar_type()), a.data.data_ptr<uint8_t>(),
                         t.data.data_ptr<uint8_t>(), xf.size(0), xf.size(1),
                         scale.data_ptr<float>(), amax.defined() ? amax.data_ptr<float>() : nullptr,
                         kernel_format(dtype), on.stream());
    return {a, t};
#else
    no_cuda("cast_transpose");
#endif
  }
  Fp8Tensor a = quantize(x, scale, dtype, amax);
  Fp8Tensor t{a.data.t().contiguous(), a.scale_inv, dtype};
  return {a, t};
}

namespace {

// Block-scaled operands, both blocked along K (TE multiplies 1D by 1D and 1D by 2D blocks, never
// 2D by 2D: Float8BlockScaling's __post_init__). The CPU reference: each operand's fp32 values
// (exact for power-of-two scales), an fp32 GEMM (whatever CPU autocast says, as below).
at::Tensor block_gemm_nt(const Fp8Tensor& a, const Fp8Tensor& b_t, bool b_is_transposed) {
  TE_CHECK(a.scaling != ScalingMode::kTensor && b_t.scaling != ScalingMode::kTensor,
           "fp8::gemm: a is scaled per ", to_string(a.scaling), " and b_t per ",
           to_string(b_t.scaling), "; a per-tensor operand does not multiply a block-scaled one");
  TE_CHECK(b_is_transposed, "fp8::gemm: block-scaled operands (", to_string(a.scaling), " x ",
           to_string(b_t.scaling),
           ") multiply as a [M, K] by b_t [N, K], both blocked along K; "
           "call gemm_nt");
  TE_CHECK(!(a.scaling == ScalingMode::kBlock128x128 && b_t.scaling == ScalingMode::kBlock128x128),
           "fp8::gemm: both operands in 128x128 tiles; block scaling multiplies 1x128 by 1x128 or "
           "by 128x128 (as TE)");
  TE_CHECK((a.scaling == ScalingMode::kBlock1x32) == (b_t.scaling == ScalingMode::kBlock1x32),
           "fp8::gemm: a is scaled per ", to_string(a.scaling), " and b_t per ",
           to_string(b_t.scaling), "; MXFP8's 1x32 blocks multiply only 1x32 blocks");
  // The codes decoded with their block scales, then an fp32 GEMM (CPU: LibTorch's; CUDA:
  // cuBLAS's, after the device decode kernels), under no autocast: the reference sums in fp32.
  // cuBLASLt's own block-scaled FP8 GEMMs (VEC128_32F / BLK128x128_32F scales from cuBLAS 12.9 on
  // sm_90, VEC32_UE8M0 and VEC16_UE4M3 on sm_100) are not used yet.
  const c10::impl::ExcludeDispatchKeyGuard fp32(c10::autocast_dispatch_keyset);
  return at::mm(a.dequantize(), b_t.dequantize().t());
}

// a [M, K] times b, given as b [K, N] or (transposed) as b_t [N, K], the layout FP8 tensor
// cores take: a caller holding both layouts (cast_transpose) passes b_t, and nothing is
// transposed on the way.
at::Tensor gemm_of(const Fp8Tensor& a, const Fp8Tensor& b, bool b_is_transposed,
                   bool fast_accumulation, at::ScalarType out) {
  // Before the shapes: NVFP4's codes are packed two a byte, so its shapes are not another's.
  TE_CHECK(is_nvfp4(a.scaling) == is_nvfp4(b.scaling), "fp8::gemm: a is scaled per ",
           to_string(a.scaling), " and b", b_is_transposed ? "_t" : "", " per ",
           to_string(b.scaling),
           "; NVFP4's E2M1 operands (1x16, 16x16) multiply only NVFP4 operands");
  const int64_t bk = b_is_transposed ? 1 : 0;  // b's contracted dim
  TE_CHECK(a.data.dim() == 2 && b.data.dim() == 2 && a.data.size(1) == b.data.size(bk),
           "fp8::gemm: a ", a.data.sizes(), " and b", b_is_transposed ? "_t " : " ", b.data.sizes(),
           " do not multiply; give a [M, K] and b [K, N] (b_t [N, K])",
           is_nvfp4(a.scaling) ? " (NVFP4 codes: [M, K / 2] and [N, K / 2], two a byte)" : "");
  TE_CHECK(a.data.scalar_type() == at::kByte && b.data.scalar_type() == at::kByte,
           "fp8::gemm: the operands must be FP8 codes (uint8)");
  TE_CHECK(!(a.dtype == DType::kE5M2 && b.dtype == DType::kE5M2),
           "fp8::gemm: both operands are E5M2, which FP8 tensor cores do not multiply; cast one "
           "to E4M3 (HYBRID keeps forward tensors in E4M3)");
  TE_CHECK(a.data.device() == b.data.device(), "fp8::gemm: a is on ", a.data.device(), " and b on ",
           b.data.device());
  if (a.scaling != ScalingMode::kTensor || b.scaling != ScalingMode::kTensor) {
    return block_gemm_nt(a, b, b_is_transposed).to(out);
  }
  // The CUDA GEMM reads both scales on the device; a host pointer there would be undefined.
  check_scale(a.scale_inv, "gemm: a.scale_inv", a.data);
  check_scale(b.scale_inv, "gemm: b.scale_inv", b.data);
  if (a.data.is_meta()) {  // shapes alone (te/runtime/meta.h)
    return at::empty({a.data.size(0), b.data.size(b_is_transposed ? 0 : 1)},
                     a.data.options().dtype(out));
  }
  if (a.data.is_cuda()) {
#ifdef TE_WITH_CUDA
    const at::Tensor ad = a.data.contiguous();
    const at::Tensor bt = b_is_transposed ? b.data.contiguous() : b.data.t().contiguous();
    // D in `out` where cuBLASLt writes it (fp32, bf16, fp16), else fp32 and converted.
    const auto d_type = real_of(out);
    at::Tensor d =
        at::empty({ad.size(0), bt.size(0)}, ad.options().dtype(d_type ? out : at::kFloat));
    const OnDevice on(ad);
    cuda::gemm(ad.data_ptr<uint8_t>(), kernel_format(a.dtype), a.scale_inv.data_ptr<float>(),
               bt.data_ptr<uint8_t>(), kernel_format(b.dtype), b.scale_inv.data_ptr<float>(),
               d.data_ptr(), d_type.value_or(cuda::kFloat32), ad.size(0), bt.size(0), ad.size(1),
               fast_accumulation, on.stream());
    return d.to(out);
#else
    (void)fast_accumulation;
    no_cuda("gemm");
#endif
  }
  // The exact values of the codes (no scale), an fp32 GEMM (exact products, fp32 sums; fast
  // accumulation is a tensor-core mode with nothing to choose here), then the product of the two
  // scales on the output. The decoded operands go to this thread's scratch buffers, which only
  // grow: fresh pages cost more than the decode on a VM.
  // In fp32 whatever CPU autocast says: bf16 would change the sums (and LibTorch's CPU bf16 GEMM
  // is a scalar loop accumulating in bf16 without AVX-512: a bf16 encoder step in FP8 ran 10x
  // slower here).
  const c10::impl::ExcludeDispatchKeyGuard fp32(c10::DispatchKey::AutocastCPU);
  thread_local at::Tensor scratch_a, scratch_b;
  const at::Tensor bd = decode_into(b, scratch_b);
  at::Tensor d = at::mm(decode_into(a, scratch_a), b_is_transposed ? bd.t() : bd);
  d.mul_(a.scale_inv.item<float>() * b.scale_inv.item<float>());
  return d.to(out);
}

}  // namespace

at::Tensor gemm(const Fp8Tensor& a, const Fp8Tensor& b, bool fast_accumulation,
                at::ScalarType out) {
  return gemm_of(a, b, /*b_is_transposed=*/false, fast_accumulation, out);
}

at::Tensor gemm_nt(const Fp8Tensor& a, const Fp8Tensor& b_t, bool fast_accumulation,
                   at::ScalarType out) {
  return gemm_of(a, b_t, /*b_is_transposed=*/true, fast_accumulation, out);
}

#if TE_HAS_FLOAT8
at::Tensor to_torch_float8(const Fp8Tensor& t) {
  return t.data.view(t.dtype == DType::kE4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2);
}

Fp8Tensor from_torch_float8(const at::Tensor& t, const at::Tensor& scale_inv) {
  TE_CHECK(t.scalar_type() == at::kFloat8_e4m3fn || t.scalar_type() == at::kFloat8_e5m2,
           "from_torch_float8: a ", t.scalar_type(), " tensor is not float8_e4m3fn or float8_e5m2");
  return {t.view(at::kByte), scale_inv,
          t.scalar_type() == at::kFloat8_e4m3fn ? DType::kE4M3 : DType::kE5M2};
}
#endif

}  // namespace te::fp8
