// The GEMM every te::nn op without FP8 runs (matmul.h).

#include "matmul.h"

#include "cpu_gemm.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <optional>
#include <utility>
#include <vector>

#include "te/compat.h"

namespace te::nn::functional::detail {

// a @ b for any floating dtype. LibTorch 1.13's CPU has no fp16 GEMM ("addmm_impl_cpu_" not
// implemented for 'Half'): fp16 operands on the CPU are widened to fp32 (exact), multiplied
// there (fp32 accumulation, as TE's GEMMs do) and the result rounded to fp16 once. Autograd
// follows the casts, so the gradients take the same route.
// LibTorch's CPU GEMM of bf16 runs on oneDNN only where the CPU has AVX-512 (BW, VL, DQ), as
// its mkldnn_bf16_device_check (aten/src/ATen/native/mkldnn/Utils.h, v1.13.1) asks; elsewhere in a
// scalar loop over 40x slower than fp32 BLAS (a 300-step `te-encoder --dtype bf16` went from about
// a minute to over 10 on an AVX2 EPYC). Even with AVX-512, a GEMM of at most 16*16*16 multiply-
// adds (m*k*n, or b*m*k*n batched: `checksize` in aten/src/ATen/native/mkldnn/Matmul.cpp) skips
// oneDNN for a naive kernel that accumulates in bf16: measured here (LibTorch 1.13.1, AVX-512
// EPYC) a [4 x 6 x 16] x [16 x 6] bmm is 1.3e-2 off the exact product relative to its magnitude,
// against 1.9e-3 for fp32 accumulation, and a DP2 bf16 layer's gradient left the matrix's bound.
// fp16 has no fast CPU GEMM at all. Such GEMMs, whether the operands are low precision or CPU
// autocast would make them so, compute in fp32 from the operands' low-precision values and round
// the result once: what oneDNN's bf16 GEMM (fp32 accumulation) and autocast's output give, and
// what TE's GEMMs accumulate in. A matmul's backward GEMMs have its forward's m*k*n, so they take
// the same route.
constexpr int64_t kOneDnnMinGemm = 16 * 16 * 16;

bool cpu_autocast_on() {
#if TE_AUTOCAST_BY_DEVICE
  return at::autocast::is_autocast_enabled(at::kCPU);
#else
  return at::autocast::is_cpu_enabled();
#endif
}

std::optional<at::ScalarType> slow_cpu_gemm_dtype(const at::Tensor& a, const at::Tensor& b) {
  // A meta tensor stands for a CPU one: te::nn::plan runs the step on meta tensors to count its
  // bytes, and the fp32 copies this route makes are part of a CPU step's peak (on a CPU without
  // AVX-512 a bf16 step's GEMMs all take it).
  if (!a.device().is_cpu() && !a.device().is_meta()) return std::nullopt;
  at::ScalarType dtype = a.scalar_type();
  if (dtype == at::kFloat) {
    if (!cpu_autocast_on()) return std::nullopt;
#if TE_AUTOCAST_BY_DEVICE
    dtype = at::autocast::get_autocast_dtype(at::kCPU);
#else
    dtype = at::autocast::get_autocast_cpu_dtype();
#endif
  }
  if (dtype == at::kHalf) return dtype;
  if (dtype != at::kBFloat16) return std::nullopt;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool avx512 = __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl") &&
                             __builtin_cpu_supports("avx512dq");
  // The multiply-adds of one matrix product (a matmul by a 2-D b folds a's batch into its rows).
  const int64_t k = a.size(-1);
  const int64_t rows =
      b.dim() == 2 ? a.numel() / std::max<int64_t>(k, 1) : (a.dim() >= 2 ? a.size(-2) : 1);
  if (avx512 && rows * k * b.size(-1) > kOneDnnMinGemm) return std::nullopt;
  return dtype;
#else
  (void)b;
  return std::nullopt;
#endif
}

at::Tensor mm_any(const at::Tensor& a, const at::Tensor& b) {
  if (auto y = onednn_linear(a, b)) return std::move(*y);
  if (b.dim() == 2 && a.dim() >= 1 && a.numel() == a.size(-1) && a.is_cpu() &&
      !slow_cpu_gemm_dtype(a, b)) {
    // One row (a decoding step of one sequence): a matrix-vector product reads b once, where
    // OpenBLAS's GEMM first copies (packs) all of b: 4x faster on SmolLM2's MLP kernels
    // (bench/bench_generate, one stream).
    std::vector<int64_t> shape(a.sizes().begin(), a.sizes().end() - 1);
    shape.push_back(b.size(1));
    return at::mv(b.t(), a.reshape({-1})).reshape(shape);
  }
  if (const auto low = slow_cpu_gemm_dtype(a, b)) {
    const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCPU);
    return at::matmul(a.to(*low).to(at::kFloat), b.to(*low).to(at::kFloat)).to(*low);
  }
  return at::matmul(a, b);
}

}  // namespace te::nn::functional::detail
