#include "gelu_tanh.h"

// Why a kernel of te's own: LibTorch 1.13's CPU at::gelu(x, "tanh") takes Sleef's tanh (4x the
// time of the erf form's kernel in fp32), and in bf16 it runs every intermediate through bf16
// (9x, and less exact: on 1010 of the 65536 bf16 inputs its output is further from the true
// value than fp32 math rounded once). bench/RESULTS.md's GeluTanhVsExact rows time both forms.
//
// The kernel computes in fp32 and rounds once, through the identity
//   0.5 x (1 + tanh(u)) = x sigmoid(2u),  2u = 2 sqrt(2/pi) (x + 0.044715 x^3),
// with e = exp(-|2u|) and r = 1 / (1 + e): sigmoid(2u) is r (2u >= 0) or e r, and its
// derivative sigmoid (1 - sigmoid) is e r^2 in both cases, so neither form cancels. The
// backward is d/dx = sigmoid(2u) + x e r^2 (2u)'. In bf16 the forward is the exact value rounded
// to nearest on all but a few of the 65536 inputs; against at::gelu on fp32 math the results
// differ by a few fp32 ulps, except where at::gelu's 1 + tanh(u) (x < 0) or 1 - tanh(u)^2 (the
// gradient) cancels and this form does not (|x| 2^-24 absolute or so).
// tests/nn/test_gelu_tanh.cpp holds the bounds, for each instruction set (TE_GELU_ISA).

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
constexpr float kExpLow = -87.33654475f;     // log(FLT_MIN): below it, exp counts as 0
// 1.5 2^23 + 127: w / ln 2 + kShift rounds to the integer kShift + n, whose low mantissa bits hold
// n + 127, 2^n's exponent field.
constexpr float kShift = 12582912.f + 127.f;
constexpr float kLog2e = 1.44269504088896341f;  // 1 / ln 2
constexpr float kLn2Hi = 0.693359375f;          // ln 2 = kLn2Hi + kLn2Lo (Cephes' expf)
constexpr float kLn2Lo = -2.12194440e-4f;

// exp(v) for v <= 0, branch-free so that the loops vectorise; 0 below log(FLT_MIN) and for NaN.
// Cephes' expf reduction, v = n ln 2 + r with |r| <= ln 2 / 2, and e^r = 1 + r + r^2 q(r), q of
// degree 4 fitted for the least maximum relative error (4e-9, under fp32's rounding).
TE_INLINE float exp_nonpositive(float v) {
  const bool normal = std::isgreaterequal(v, kExpLow);  // (quiet compares if-convert)
  const float w = normal ? v : 0.f;
  const float t = w * kLog2e + kShift;
  const float n = t - kShift;
  const float r = (w - n * kLn2Hi) - n * kLn2Lo;
  // (Estrin's scheme: a shorter dependency chain than Horner's)
  const float r2 = r * r;
  const float q0 = 1.66665211e-1f * r + 4.99999940e-1f;
  const float q1 = 8.36871006e-3f * r + 4.16683890e-2f;
  const float q = (1.38145999e-3f * r2 + q1) * r2 + q0;
  const float er = q * r2 + r + 1.f;
  uint32_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  bits <<= 23;  // 2^n (n + 127 is in [1, 127])
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  const float value = er * scale;  // (computed either way: a select, not a branch)
  return normal ? value : 0.f;
}

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

TE_INLINE float load(at::BFloat16 v) {
  const uint32_t bits = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even, NaN to the canonical NaN: c10::BFloat16(float)'s rounding.
TE_INLINE void store(at::BFloat16* out, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  out->x = v != v ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

// fp32 directly; bf16 through fp32 blocks on the stack (three loops that vectorise apiece run
// faster than one that mixes the widths). g_stride 0: one gradient for every element (the
// expanded gradient of a sum).
constexpr int64_t kBlock = 256;

TE_INLINE void forward_loop(const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_forward(x[i]);
}
TE_INLINE void backward_loop(const float* __restrict g, int64_t g_stride, const float* __restrict x,
                             float* __restrict dx, int64_t n) {
  if (g_stride == 0) {
    const float g0 = g[0];
    for (int64_t i = 0; i < n; ++i) dx[i] = gelu_backward(g0, x[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dx[i] = gelu_backward(g[i], x[i]);
  }
}
TE_INLINE void widen(const at::BFloat16* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = load(in[i]);
}
TE_INLINE void narrow(const float* in, at::BFloat16* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) store(out + i, in[i]);
}
TE_INLINE void forward_loop(const at::BFloat16* x, at::BFloat16* y, int64_t n) {
  alignas(64) float in[kBlock], out[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    widen(x + b, in, m);
    forward_loop(in, out, m);
    narrow(out, y + b, m);
  }
}
TE_INLINE void backward_loop(const at::BFloat16* g, int64_t g_stride, const at::BFloat16* x,
                             at::BFloat16* dx, int64_t n) {
  alignas(64) float gb[kBlock], xb[kBlock], out[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    if (g_stride == 0) {
      gb[0] = load(g[0]);
    } else {
      widen(g + b, gb, m);
    }
    widen(x + b, xb, m);
    backward_loop(gb, g_stride, xb, out, m);
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

#define TE_GELU_KERNELS(suffix, attribute)                                                        \
  attribute void forward_f32_##suffix(const float* x, float* y, int64_t n) {                      \
    forward_loop(x, y, n);                                                                        \
  }                                                                                               \
  attribute void forward_bf16_##suffix(const at::BFloat16* x, at::BFloat16* y, int64_t n) {       \
    forward_loop(x, y, n);                                                                        \
  }                                                                                               \
  attribute void backward_f32_##suffix(const float* g, int64_t gs, const float* x, float* dx,     \
                                       int64_t n) {                                               \
    backward_loop(g, gs, x, dx, n);                                                               \
  }                                                                                               \
  attribute void backward_bf16_##suffix(const at::BFloat16* g, int64_t gs, const at::BFloat16* x, \
                                        at::BFloat16* dx, int64_t n) {                            \
    backward_loop(g, gs, x, dx, n);                                                               \
  }
#define TE_GELU_SET(suffix, name)                                                               \
  Kernels {                                                                                     \
    forward_f32_##suffix, forward_bf16_##suffix, backward_f32_##suffix, backward_bf16_##suffix, \
        name                                                                                    \
  }

TE_GELU_KERNELS(base, )
#if TE_GELU_X86
TE_GELU_KERNELS(
    avx512, __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512"))))
TE_GELU_KERNELS(avx2, __attribute__((target("avx2,fma"))))
#endif

// The best set this CPU runs, or the one TE_GELU_ISA names (avx512, avx2, baseline: for tests
// and comparisons). Chosen once; read-only afterwards.
const Kernels& kernels() {
  static const Kernels chosen = [] {
    std::vector<Kernels> runnable;  // best first
#if TE_GELU_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      runnable.push_back(TE_GELU_SET(avx512, "avx512"));
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      runnable.push_back(TE_GELU_SET(avx2, "avx2"));
    }
#endif
    runnable.push_back(TE_GELU_SET(base, "baseline"));
    const char* wanted = std::getenv("TE_GELU_ISA");
    if (wanted == nullptr || *wanted == '\0') return runnable.front();
    std::string names;
    for (const Kernels& k : runnable) {
      if (std::strcmp(k.isa, wanted) == 0) return k;
      names += names.empty() ? k.isa : std::string(", ") + k.isa;
    }
    TE_FAIL("TE_GELU_ISA=", wanted, " is not an instruction set this CPU runs the tanh gelu with; ",
            "use one of ", names, " or unset it");
  }();
  return chosen;
}

constexpr int64_t kGrain = 16384;

// The loops run under TensorIterator (strides, broadcasting and the output's layout as
// at::gelu's), whose for_each LibTorch parallelises inside libtorch_cpu: LibTorch 1.13's
// at::parallel_for is inline, and in code built without OpenMP (as te is) it runs one thread.
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

at::Tensor fused_forward(const at::Tensor& x) {
  at::Tensor y = at::empty_like(x);
  at::TensorIterator iter = at::TensorIteratorConfig().add_output(y).add_input(x).build();
  const Kernels& k = kernels();
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

at::Tensor fused_backward(const at::Tensor& g, const at::Tensor& x) {
  at::Tensor dx = at::empty_like(x);
  at::TensorIterator iter =
      at::TensorIteratorConfig().add_output(dx).add_input(g).add_input(x).build();
  const Kernels& k = kernels();
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

// at::gelu(x, "tanh")'s autograd: the input saved, nothing else.
class GeluTanh : public torch::autograd::Function<GeluTanh> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x) {
    ctx->save_for_backward({x});
    return fused_forward(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor x = ctx->get_saved_variables()[0];
    const at::Tensor& g = grads[0];
    // A backward that builds a graph (double backward) or an odd gradient: LibTorch's.
    if (at::GradMode::is_enabled() || g.scalar_type() != x.scalar_type() ||
        g.sizes() != x.sizes() || !g.device().is_cpu()) {
      return {at::gelu_backward(g, x, "tanh")};
    }
    return {fused_backward(g, x)};
  }
};

}  // namespace

bool gelu_tanh_fused(const at::Tensor& x) {
  return x.device().is_cpu() && x.layout() == at::kStrided &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16);
}

at::Tensor gelu_tanh(const at::Tensor& x) {
  if (!gelu_tanh_fused(x)) return at::gelu(x, "tanh");
  if (at::GradMode::is_enabled() && x.requires_grad()) return GeluTanh::apply(x);
  return fused_forward(x);
}

}  // namespace te::nn::functional::detail
