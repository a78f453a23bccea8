// fp32 CPU GEMMs without autograd on oneDNN (cpu_gemm.h).
//
// Why: Debian's LibTorch multiplies fp32 on the CPU with OpenBLAS, which on this project's AVX-512
// machines runs its AVX2 kernels; oneDNN's matmul (the library LibTorch itself links, so no new
// run-time dependency) runs AVX-512 ones and takes the kernel in te's [K, N] layout as it is (no
// packed copy, no cache). Measured here (bench/bench_generate --roof, 2 threads, SmolLM2's decode
// GEMMs): ~2x OpenBLAS's GEMM at 16-2048 rows and on a par or faster at one row. GEMMs that
// record an autograd graph keep LibTorch's, whose autograd records the backward; those inside te's
// own autograd functions (FSDP's gathered dense, forward and backward) record none and take
// oneDNN.

#include "cpu_gemm.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/TensorSubclassLikeUtils.h>

#include <cstdlib>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "matmul.h"
#include "te/error.h"
#include "te/nn/inference.h"

#ifndef TE_HAVE_ONEDNN
#define TE_HAVE_ONEDNN 0
#endif
#if TE_HAVE_ONEDNN
#include <dnnl.hpp>
#endif

namespace te::nn {

namespace {

// TE_CPU_GEMM: unset or "onednn" (the default), or "libtorch" (OpenBLAS here: the peer bench/
// measures against). Read once: the choice holds for the process.
bool onednn_chosen() {
  static const bool chosen = [] {
    const char* env = std::getenv("TE_CPU_GEMM");
    const std::string v = env == nullptr ? "" : env;
    TE_CHECK(v.empty() || v == "onednn" || v == "libtorch", "TE_CPU_GEMM='", v,
             "' is neither onednn nor libtorch (the library te::nn's float32 CPU GEMMs without "
             "autograd run on); unset it for oneDNN");
    return v != "libtorch";
  }();
  return chosen;
}

}  // namespace

std::string cpu_gemm_library() {
  const bool chosen = onednn_chosen();  // checks TE_CPU_GEMM in every build
  return TE_HAVE_ONEDNN && chosen ? "onednn" : "libtorch";
}

std::string cpu_gemm_summary() {
  std::string library;
  try {
    library = cpu_gemm_library();
  } catch (const Error& e) {
    return e.what();
  }
  const std::string other = library == "onednn" ? "TE_CPU_GEMM=libtorch: LibTorch's BLAS"
                            : TE_HAVE_ONEDNN    ? "unset TE_CPU_GEMM for oneDNN, ~2x faster here"
                                                : "this build has no oneDNN (CMake TE_ONEDNN)";
  return "float32 CPU GEMMs without autograd: " + library + " (" + other + ")";
}

}  // namespace te::nn

namespace te::nn::functional::detail {

namespace {

bool needs_graph(const at::Tensor& t) { return t.defined() && t.requires_grad(); }

// The strides oneDNN reads w [K, N] with: its rows or its columns contiguous (a kernel, or a
// table [N, K] transposed), or none.
std::optional<std::pair<int64_t, int64_t>> weight_strides(const at::Tensor& w) {
  const int64_t k = w.size(0), n = w.size(1);
  int64_t s0 = w.stride(0), s1 = w.stride(1);
  // A dim of size one has no meaningful stride (reshape and narrow leave any there): the one
  // that makes the other layout's test pass.
  if (k == 1) s0 = s1 == 1 ? n : 1;
  if (n == 1) s1 = s0 == 1 && k > 1 ? k : 1;
  if (s1 == 1 && s0 >= n) return std::pair<int64_t, int64_t>{s0, 1};
  if (s0 == 1 && s1 >= k) return std::pair<int64_t, int64_t>{1, s1};
  return std::nullopt;
}

#if TE_HAVE_ONEDNN

using Dims = dnnl::memory::dims;
using DataType = dnnl::memory::data_type;

thread_local int64_t onednn_gemms = 0;

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// oneDNN 3 dropped the operation descriptors: the primitive descriptor takes the memory ones.
dnnl::matmul::primitive_desc matmul_desc(const dnnl::memory::desc& src,
                                         const dnnl::memory::desc& weights,
                                         const dnnl::memory::desc& bias,
                                         const dnnl::memory::desc& dst) {
  // float32 throughout, whatever ONEDNN_DEFAULT_FPMATH_MODE says (bf16 or tf32 would round).
  dnnl::primitive_attr attr;
  attr.set_fpmath_mode(dnnl::fpmath_mode::strict);
#if DNNL_VERSION_MAJOR >= 3
  return dnnl::matmul::primitive_desc(cpu_engine(), src, weights, bias, dst, attr);
#else
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, weights, bias, dst), attr,
                                      cpu_engine());
#endif
}

#endif

}  // namespace

std::optional<at::Tensor> onednn_linear(const at::Tensor& x, const at::Tensor& w,
                                        const at::Tensor& bias) {
  // Plain strided float32 CPU memory oneDNN can read as it is: no sparse or mkldnn layout, no
  // lazy negation (a real view of a complex tensor's conjugate), no zero tensor, no wrapper
  // tensor (functorch), no forward-mode tangent to carry.
  const auto fp32_cpu = [](const at::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == at::kFloat && t.layout() == at::kStrided &&
           !t.is_neg() && !t._is_zerotensor() && !at::isTensorSubclassLike(t) &&
           !t._fw_grad(/*level=*/0).defined();
  };
  if (!fp32_cpu(x) || !fp32_cpu(w) || w.dim() != 2 || x.dim() < 1 || x.size(-1) != w.size(0)) {
    return std::nullopt;
  }
  const int64_t k = w.size(0), n = w.size(1);
  const int64_t m = k == 0 ? 0 : x.numel() / k;
  if (m == 0 || k == 0 || n == 0) return std::nullopt;
  if (bias.defined() && (!fp32_cpu(bias) || bias.numel() != n)) return std::nullopt;
  if (at::GradMode::is_enabled() && (needs_graph(x) || needs_graph(w) || needs_graph(bias))) {
    return std::nullopt;
  }
  if (cpu_autocast_on() || !onednn_chosen()) return std::nullopt;
  const auto w_strides = weight_strides(w);
  if (!w_strides) return std::nullopt;
#if TE_HAVE_ONEDNN

  at::Tensor x2 = x.reshape({m, k});
  // Rows of x contiguous, or a copy that has them (size-one dims' strides read as contiguous).
  int64_t row_stride = m == 1 ? k : x2.stride(0);
  if ((k > 1 && x2.stride(1) != 1) || row_stride < k) {
    x2 = x2.contiguous();
    row_stride = k;
  }
  const at::Tensor b = bias.defined() ? bias.reshape({1, n}).contiguous() : at::Tensor();
  at::Tensor y = at::empty({m, n}, x.options().memory_format(at::MemoryFormat::Contiguous));

  // OpenMP sizes oneDNN's parallel regions: LibTorch's thread count, set on this thread first.
  at::internal::lazy_init_num_threads();
  const dnnl::memory::desc src({m, k}, DataType::f32, Dims{row_stride, 1});
  const dnnl::memory::desc weights({k, n}, DataType::f32,
                                   Dims{w_strides->first, w_strides->second});
  const dnnl::memory::desc dst({m, n}, DataType::f32, Dims{n, 1});
  const dnnl::memory::desc bias_md =
      b.defined() ? dnnl::memory::desc({1, n}, DataType::f32, Dims{n, 1}) : dnnl::memory::desc();
  std::optional<dnnl::matmul> matmul;
  try {
    // oneDNN's primitive cache makes a repeated shape's descriptor and primitive ~1 us.
    matmul.emplace(matmul_desc(src, weights, bias_md, dst));
  } catch (const dnnl::error&) {
    return std::nullopt;  // a layout or ISA this oneDNN declines: LibTorch's GEMM takes it
  }
  try {
    const dnnl::engine& engine = cpu_engine();
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(src, engine, x2.data_ptr())},
        {DNNL_ARG_WEIGHTS, dnnl::memory(weights, engine, w.data_ptr())},
        {DNNL_ARG_DST, dnnl::memory(dst, engine, y.data_ptr())}};
    if (b.defined()) {
      args.emplace(DNNL_ARG_BIAS, dnnl::memory(bias_md, engine, b.data_ptr()));
    }
    thread_local dnnl::stream stream(engine);
    matmul->execute(stream, args);
    stream.wait();
    ++onednn_gemms;
  } catch (const dnnl::error& e) {
    TE_FAIL("oneDNN's matmul failed on x ", x.sizes(), " @ w ", w.sizes(), " (strides ",
            w.strides(), "): ", e.what(), "; TE_CPU_GEMM=libtorch runs it on LibTorch");
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end() - 1);
  shape.push_back(n);
  return y.view(shape);
#else
  return std::nullopt;
#endif
}

}  // namespace te::nn::functional::detail

namespace te::nn {

int64_t onednn_gemm_count() {
#if TE_HAVE_ONEDNN
  return functional::detail::onednn_gemms;
#else
  return 0;
#endif
}

}  // namespace te::nn
