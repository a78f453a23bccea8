#include "activation_cpu.h"

// te's CPU kernels for two activations, the tanh-form gelu and SiLU, in fp32 and bf16.
//
// Why a kernel of te's own for the tanh gelu: LibTorch 1.13's CPU at::gelu(x, "tanh") takes Sleef's
// tanh (4x the time of the erf form's kernel in fp32), and in bf16 it runs every intermediate
// through bf16 (9x, and less exact: on 1010 of the 65536 bf16 inputs its output is further from the
// true value than fp32 math rounded once). bench/RESULTS.md's GeluTanhVsExact rows time both forms.
//
// The kernel computes in fp32 and rounds once, through the identity
//   0.5 x (1 + tanh(u)) = x sigmoid(2u),  2u = 2 sqrt(2/pi) (x + 0.044715 x^3),
// with e = exp(-|2u|) and r = 1 / (1 + e): sigmoid(2u) is r (2u >= 0) or e r, and its
// derivative sigmoid (1 - sigmoid) is e r^2 in both cases, so neither form cancels. The
// backward is d/dx = sigmoid(2u) + x e r^2 (2u)'. In bf16 the forward is the exact value rounded
// to nearest on all but a few of the 65536 inputs; against at::gelu on fp32 math the results
// differ by a few fp32 ulps, except where at::gelu's 1 + tanh(u) (x < 0) or 1 - tanh(u)^2 (the
// gradient) cancels and this form does not (|x| 2^-24 absolute or so).
//
// SiLU (x sigmoid(x), Llama's and Qwen's MLP): LibTorch 1.13's bf16 at::silu and its backward
// took 3x and 5x PyTorch 2.11's time in a bf16 SmolLM2 training step (144 against 35 ms); the
// same sigmoid as above, sigmoid(x) = r or e r with e = exp(-|x|), d/dx = sigmoid + x e r^2.
// tests/nn/test_activation_cpu.cpp holds the bounds, for each instruction set (TE_GELU_ISA, which
// picks the set for both activations).

#include <ATen/ATen.h>
#include <ATen/TensorIterator.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu_loops.h"
#include "fast_exp.h"
#include "te/error.h"

namespace te::nn::functional::detail {

namespace {

// x86-64 builds also compile the loops for AVX2 + FMA and for AVX-512 and take the best this CPU
// runs (kernels()).
#if defined(__x86_64__) && defined(__GNUC__)
#define TE_GELU_X86 1
#define TE_INLINE __attribute__((always_inline)) inline
#else
#define TE_GELU_X86 0
#define TE_INLINE inline
#endif

constexpr float kA = 1.5957691216057308f;    // 2 sqrt(2/pi)
constexpr float kB = 0.07135481627260025f;   // 2 sqrt(2/pi) 0.044715
constexpr float kB3 = 0.21406444881780076f;  // 3 kB
TE_INLINE float gelu_forward(float x) {
  const float z = x * (kA + kB * (x * x));
  const float e = exp_nonpositive(-std::fabs(z));
  const float r = 1.f / (1.f + e);
  const float er = e * r;
  return x * (std::isgreaterequal(z, 0.f) ? r : er);
}

TE_INLINE float gelu_backward(float g, float x) {
  const float x2 = x * x;
  const float z = x * (kA + kB * x2);
  const float e = exp_nonpositive(-std::fabs(z));
  const float r = 1.f / (1.f + e);
  const float er = e * r;
  const float s = std::isgreaterequal(z, 0.f) ? r : er;
  return g * (s + (x * (er * r)) * (kA + kB3 * x2));
}

TE_INLINE float silu_forward(float x) {
  const float e = exp_nonpositive(-std::fabs(x));
  const float r = 1.f / (1.f + e);
  return x * (std::isgreaterequal(x, 0.f) ? r : e * r);
}

TE_INLINE float silu_backward(float g, float x) {
  const float e = exp_nonpositive(-std::fabs(x));
  const float r = 1.f / (1.f + e);
  const float s = std::isgreaterequal(x, 0.f) ? r : e * r;
  return g * (s + x * (e * r * r));
}

// The activations, each with LibTorch's backward for what the kernels do not take.
struct GeluTanhOp {
  static TE_INLINE float forward(float x) { return gelu_forward(x); }
  static TE_INLINE float backward(float g, float x) { return gelu_backward(g, x); }
  static at::Tensor libtorch_forward(const at::Tensor& x) { return at::gelu(x, "tanh"); }
  static at::Tensor libtorch_backward(const at::Tensor& g, const at::Tensor& x) {
    return at::gelu_backward(g, x, "tanh");
  }
};
struct SiluOp {
  static TE_INLINE float forward(float x) { return silu_forward(x); }
  static TE_INLINE float backward(float g, float x) { return silu_backward(g, x); }
  static at::Tensor libtorch_forward(const at::Tensor& x) { return at::silu(x); }
  static at::Tensor libtorch_backward(const at::Tensor& g, const at::Tensor& x) {
    if (!at::GradMode::is_enabled()) return at::silu_backward(g, x);
    // A backward that builds a graph: the composite form LibTorch's own silu takes then
    // (silu_backward has no derivative in 1.13).
    const at::Tensor s = at::sigmoid(x);
    return g * s * (1 + x * (1 - s));
  }
};

// fp32 directly; bf16 through fp32 blocks on the stack (three loops that vectorise apiece run
// faster than one that mixes the widths). g_stride 0: one gradient for every element (the
// expanded gradient of a sum).
constexpr int64_t kBlock = 256;

template <typename Op>
TE_INLINE void forward_loop(const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = Op::forward(x[i]);
}
template <typename Op>
TE_INLINE void backward_loop(const float* __restrict g, int64_t g_stride, const float* __restrict x,
                             float* __restrict dx, int64_t n) {
  if (g_stride == 0) {
    const float g0 = g[0];
    for (int64_t i = 0; i < n; ++i) dx[i] = Op::backward(g0, x[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dx[i] = Op::backward(g[i], x[i]);
  }
}
TE_INLINE void widen(const at::BFloat16* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}
TE_INLINE void narrow(const float* in, at::BFloat16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) float_to_bf16(out + i, in[i]);
}
template <typename Op>
TE_INLINE void forward_loop(const at::BFloat16* x, at::BFloat16* y, int64_t n) {
  alignas(64) float in[kBlock], out[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    widen(x + b, in, m);
    forward_loop<Op>(in, out, m);
    narrow(out, y + b, m);
  }
}
template <typename Op>
TE_INLINE void backward_loop(const at::BFloat16* g, int64_t g_stride, const at::BFloat16* x,
                             at::BFloat16* dx, int64_t n) {
  alignas(64) float gb[kBlock], xb[kBlock], out[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    if (g_stride == 0) {
      gb[0] = bf16_to_float(g[0]);
    } else {
      widen(g + b, gb, m);
    }
    widen(x + b, xb, m);
    backward_loop<Op>(gb, g_stride, xb, out, m);
    narrow(out, dx + b, m);
  }
}

// One set of the four loops per instruction set.
struct Kernels {
  void (*forward_f32)(const float*, float*, int64_t);
  void (*forward_bf16)(const at::BFloat16*, at::BFloat16*, int64_t);
  void (*backward_f32)(const float*, int64_t, const float*, float*, int64_t);
  void (*backward_bf16)(const at::BFloat16*, int64_t, const at::BFloat16*, at::BFloat16*, int64_t);
  const char* isa;

  void forward(const float* x, float* y, int64_t n) const { forward_f32(x, y, n); }
  void forward(const at::BFloat16* x, at::BFloat16* y, int64_t n) const { forward_bf16(x, y, n); }
  void backward(const float* g, int64_t gs, const float* x, float* dx, int64_t n) const {
    backward_f32(g, gs, x, dx, n);
  }
  void backward(const at::BFloat16* g, int64_t gs, const at::BFloat16* x, at::BFloat16* dx,
                int64_t n) const {
    backward_bf16(g, gs, x, dx, n);
  }
};

#define TE_ACTIVATION_KERNELS(suffix, attribute)                                                  \
  template <typename Op>                                                                          \
  attribute void forward_f32_##suffix(const float* x, float* y, int64_t n) {                      \
    forward_loop<Op>(x, y, n);                                                                    \
  }                                                                                               \
  template <typename Op>                                                                          \
  attribute void forward_bf16_##suffix(const at::BFloat16* x, at::BFloat16* y, int64_t n) {       \
    forward_loop<Op>(x, y, n);                                                                    \
  }                                                                                               \
  template <typename Op>                                                                          \
  attribute void backward_f32_##suffix(const float* g, int64_t gs, const float* x, float* dx,     \
                                       int64_t n) {                                               \
    backward_loop<Op>(g, gs, x, dx, n);                                                           \
  }                                                                                               \
  template <typename Op>                                                                          \
  attribute void backward_bf16_##suffix(const at::BFloat16* g, int64_t gs, const at::BFloat16* x, \
                                        at::BFloat16* dx, int64_t n) {                            \
    backward_loop<Op>(g, gs, x, dx, n);                                                           \
  }
#define TE_ACTIVATION_SET(suffix, name)                                             \
  Kernels {                                                                         \
    forward_f32_##suffix<Op>, forward_bf16_##suffix<Op>, backward_f32_##suffix<Op>, \
        backward_bf16_##suffix<Op>, name                                            \
  }

TE_ACTIVATION_KERNELS(base, )
#if TE_GELU_X86
TE_ACTIVATION_KERNELS(
    avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512"))))
TE_ACTIVATION_KERNELS(avx2, __attribute__((target("avx2,fma"))))
#endif

// Op's best set this CPU runs, or the one TE_GELU_ISA names (avx512, avx2, baseline: for tests
// and comparisons). Chosen once; read-only afterwards.
template <typename Op>
const Kernels& kernels() {
  static const Kernels chosen = [] {
    std::vector<Kernels> runnable;  // best first
#if TE_GELU_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      runnable.push_back(TE_ACTIVATION_SET(avx512, "avx512"));
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      runnable.push_back(TE_ACTIVATION_SET(avx2, "avx2"));
    }
#endif
    runnable.push_back(TE_ACTIVATION_SET(base, "baseline"));
    const char* wanted = std::getenv("TE_GELU_ISA");
    if (wanted == nullptr || *wanted == '\0') return runnable.front();
    std::string names;
    for (const Kernels& k : runnable) {
      if (std::strcmp(k.isa, wanted) == 0) return k;
      names += names.empty() ? k.isa : std::string(", ") + k.isa;
    }
    TE_FAIL("TE_GELU_ISA=", wanted,
            " is not an instruction set this CPU runs te's activation kernels with; ",
            "use one of ", names, " or unset it");
  }();
  return chosen;
}

constexpr int64_t kGrain = 16384;

// The loops run under TensorIterator (strides, broadcasting and the output's layout as
// at::gelu's), whose for_each LibTorch parallelises inside libtorch_cpu (no te_parallel_sources
// needed: te/runtime/parallel.h says why a file of te's own calling at::parallel_for does).
// Each inner run of n elements whose strides are T's size (a gradient's may be 0: one value)
// goes to the kernel as it is; any other is copied through blocks on the stack.
template <typename T>
const T* at_byte(const char* base, int64_t stride, int64_t i) {
  return reinterpret_cast<const T*>(base + i * stride);
}

template <typename T>
void forward_run(const Kernels& k, char* out, int64_t out_stride, const char* in, int64_t in_stride,
                 int64_t n) {
  constexpr int64_t s = sizeof(T);
  if (out_stride == s && in_stride == s) {
    return k.forward(reinterpret_cast<const T*>(in), reinterpret_cast<T*>(out), n);
  }
  T xb[kBlock], yb[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    for (int64_t i = 0; i < m; ++i) xb[i] = *at_byte<T>(in, in_stride, b + i);
    k.forward(xb, yb, m);
    for (int64_t i = 0; i < m; ++i) *reinterpret_cast<T*>(out + (b + i) * out_stride) = yb[i];
  }
}

template <typename T>
void backward_run(const Kernels& k, char** data, const int64_t* strides, int64_t n) {
  constexpr int64_t s = sizeof(T);
  char* dx = data[0];
  const char* g = data[1];
  const char* x = data[2];
  if (strides[0] == s && strides[2] == s && (strides[1] == s || strides[1] == 0)) {
    return k.backward(reinterpret_cast<const T*>(g), strides[1] == 0 ? 0 : 1,
                      reinterpret_cast<const T*>(x), reinterpret_cast<T*>(dx), n);
  }
  T gb[kBlock], xb[kBlock], db[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    for (int64_t i = 0; i < m; ++i) {
      gb[i] = *at_byte<T>(g, strides[1], b + i);
      xb[i] = *at_byte<T>(x, strides[2], b + i);
    }
    k.backward(gb, 1, xb, db, m);
    for (int64_t i = 0; i < m; ++i) *reinterpret_cast<T*>(dx + (b + i) * strides[0]) = db[i];
  }
}

// f(T*) with T the dtype of x: float or at::BFloat16.
template <typename F>
void with_type(const at::Tensor& x, const F& f) {
  if (x.scalar_type() == at::kFloat) {
    f(static_cast<float*>(nullptr));
  } else {
    f(static_cast<at::BFloat16*>(nullptr));
  }
}

at::Tensor fused_forward(const Kernels& k, const at::Tensor& x) {
  at::Tensor y = at::empty_like(x);
  at::TensorIterator iter = at::TensorIteratorConfig().add_output(y).add_input(x).build();
  with_type(x, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    auto loop = [&](char** data, const int64_t* strides, int64_t n, int64_t rows) {
      for (int64_t r = 0; r < rows; ++r) {
        forward_run<T>(k, data[0] + r * strides[2], strides[0], data[1] + r * strides[3],
                       strides[1], n);
      }
    };
    iter.for_each(loop, kGrain);
  });
  return y;
}

at::Tensor fused_backward(const Kernels& k, const at::Tensor& g, const at::Tensor& x) {
  at::Tensor dx = at::empty_like(x);
  at::TensorIterator iter =
      at::TensorIteratorConfig().add_output(dx).add_input(g).add_input(x).build();
  with_type(x, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    auto loop = [&](char** data, const int64_t* strides, int64_t n, int64_t rows) {
      char* ptrs[3] = {data[0], data[1], data[2]};
      for (int64_t r = 0; r < rows; ++r) {
        backward_run<T>(k, ptrs, strides, n);
        for (int t = 0; t < 3; ++t) ptrs[t] += strides[3 + t];
      }
    };
    iter.for_each(loop, kGrain);
  });
  return dx;
}

// The activation's autograd as LibTorch's: the input saved, nothing else.
template <typename Op>
class Activation : public torch::autograd::Function<Activation<Op>> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return fused_forward(kernels<Op>(), x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor& g = grads[0];
    // A backward that builds a graph (double backward) or an odd gradient: LibTorch's.
    if (at::GradMode::is_enabled() || g.scalar_type() != x.scalar_type() ||
        g.sizes() != x.sizes() || !g.device().is_cpu()) {
      return {Op::libtorch_backward(g, x)};
    }
    return {fused_backward(kernels<Op>(), g, x)};
  }
};

template <typename Op>
at::Tensor run(const at::Tensor& x) {
  if (!cpu_activation_fused(x)) return Op::libtorch_forward(x);
  if (at::GradMode::is_enabled() && x.requires_grad()) return Activation<Op>::apply(x);
  return fused_forward(kernels<Op>(), x);
}

}  // namespace

bool cpu_activation_fused(const at::Tensor& x) {
  return x.device().is_cpu() && x.layout() == at::kStrided &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16);
}

at::Tensor gelu_tanh(const at::Tensor& x) { return run<GeluTanhOp>(x); }

at::Tensor silu(const at::Tensor& x) { return run<SiluOp>(x); }

}  // namespace te::nn::functional::detail
