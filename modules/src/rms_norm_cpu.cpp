#include "rms_norm_cpu.h"

// RMSNorm on the CPU in one pass a row. Forward, for a row w (float32, widened once from bf16):
//   r = 1 / sqrt(sum(w^2) / H + epsilon),  n = w r,
//   y = round(round(n) * gamma)  (Llama: the normalised row in x's dtype, then the scale), or
//   y = round(n * (gamma + 1))   (zero-centered gamma: float32 throughout, rounded once),
// r saved for backward. Backward, with dn = dy * gamma (or dy * (gamma + 1)) in float32:
//   dx = r (dn - n mean(dn n)),  dgamma = sum over rows of dy * round(n) (or dy * n).
// Rows are split over LibTorch's threads; dgamma's sum is taken in blocks of kRows rows, each
// block's partial summed in block order: the same on any thread count. Against the composite
// form (LibTorch's ops, which round at each op in bf16) the results differ by float32 rounding.

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cpu_loops.h"
#include "te/error.h"
#include "te/runtime/parallel.h"

namespace te::nn::functional::detail {

namespace {

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__)
#define TE_NORM_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define TE_NORM_CLONES
#endif

constexpr int64_t kRows = 32;  // rows a task takes (and a block of dgamma's sum)

TE_LOOP_INLINE float widen(float v) { return v; }
TE_LOOP_INLINE float widen(at::BFloat16 v) { return bf16_to_float(v); }
TE_LOOP_INLINE void narrow(float* out, float v) { *out = v; }
TE_LOOP_INLINE void narrow(at::BFloat16* out, float v) { float_to_bf16(out, v); }
// v as x's dtype rounds it, back in float32.
TE_LOOP_INLINE float rounded(float v, float) { return v; }
TE_LOOP_INLINE float rounded(float v, at::BFloat16) {
  at::BFloat16 b;
  float_to_bf16(&b, v);
  return bf16_to_float(b);
}

struct Row {
  int64_t h;
  float epsilon;
  bool zero_centered;
};

// One row forward: y from x, its r returned. w: a float32 copy of the row.
template <typename T>
TE_LOOP_INLINE float forward_row(const Row& c, const T* x, const float* g, T* y, float* w) {
  for (int64_t i = 0; i < c.h; ++i) w[i] = widen(x[i]);
  const float r = 1.f / std::sqrt(dot16(w, w, c.h) / static_cast<float>(c.h) + c.epsilon);
  if (c.zero_centered) {
    for (int64_t i = 0; i < c.h; ++i) narrow(y + i, w[i] * r * (g[i] + 1.f));
  } else {
    for (int64_t i = 0; i < c.h; ++i) narrow(y + i, rounded(w[i] * r, T{}) * g[i]);
  }
  return r;
}

// One row backward: dx, and the row's share of dgamma added to dg. w, dn: float32 scratch.
template <typename T>
TE_LOOP_INLINE void backward_row(const Row& c, const T* x, const T* dy, const float* g, float r,
                                 T* dx, float* dg, float* w, float* dn) {
  for (int64_t i = 0; i < c.h; ++i) {
    w[i] = widen(x[i]) * r;  // n
    const float d = widen(dy[i]);
    dn[i] = d * (c.zero_centered ? g[i] + 1.f : g[i]);
    dg[i] += d * (c.zero_centered ? w[i] : rounded(w[i], T{}));
  }
  const float mean = dot16(dn, w, c.h) / static_cast<float>(c.h);
  for (int64_t i = 0; i < c.h; ++i) narrow(dx + i, r * (dn[i] - w[i] * mean));
}

TE_NORM_CLONES void forward_f32(const Row& c, const float* x, const float* g, float* y, float* r,
                                float* w, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) r[i] = forward_row(c, x + i * c.h, g, y + i * c.h, w);
}
TE_NORM_CLONES void forward_bf16(const Row& c, const at::BFloat16* x, const float* g,
                                 at::BFloat16* y, float* r, float* w, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) r[i] = forward_row(c, x + i * c.h, g, y + i * c.h, w);
}
TE_NORM_CLONES void backward_f32(const Row& c, const float* x, const float* dy, const float* g,
                                 const float* r, float* dx, float* dg, float* w, float* dn,
                                 int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) {
    backward_row(c, x + i * c.h, dy + i * c.h, g, r[i], dx + i * c.h, dg, w, dn);
  }
}
TE_NORM_CLONES void backward_bf16(const Row& c, const at::BFloat16* x, const at::BFloat16* dy,
                                  const float* g, const float* r, at::BFloat16* dx, float* dg,
                                  float* w, float* dn, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) {
    backward_row(c, x + i * c.h, dy + i * c.h, g, r[i], dx + i * c.h, dg, w, dn);
  }
}

void forward_rows(const Row& c, const at::Tensor& x, const float* g, at::Tensor& y, float* r,
                  int64_t rows) {
  const int64_t tasks = (rows + kRows - 1) / kRows;
  at::parallel_for(0, tasks, 1, [&](int64_t first, int64_t last) {
    std::vector<float> w(static_cast<std::size_t>(c.h));
    const int64_t r0 = first * kRows, n = std::min(rows, last * kRows) - r0;
    if (x.scalar_type() == at::kFloat) {
      forward_f32(c, x.data_ptr<float>() + r0 * c.h, g, y.data_ptr<float>() + r0 * c.h, r + r0,
                  w.data(), n);
    } else {
      forward_bf16(c, x.data_ptr<at::BFloat16>() + r0 * c.h, g,
                   y.data_ptr<at::BFloat16>() + r0 * c.h, r + r0, w.data(), n);
    }
  });
}

// dx, and each block's dgamma partial in partials[block].
void backward_rows(const Row& c, const at::Tensor& x, const at::Tensor& dy, const float* g,
                   const float* r, at::Tensor& dx, float* partials, int64_t rows) {
  const int64_t tasks = (rows + kRows - 1) / kRows;
  at::parallel_for(0, tasks, 1, [&](int64_t first, int64_t last) {
    std::vector<float> w(static_cast<std::size_t>(c.h)), dn(w.size());
    for (int64_t t = first; t < last; ++t) {
      const int64_t r0 = t * kRows, n = std::min(rows, r0 + kRows) - r0;
      float* dg = partials + t * c.h;
      std::fill(dg, dg + c.h, 0.f);
      if (x.scalar_type() == at::kFloat) {
        backward_f32(c, x.data_ptr<float>() + r0 * c.h, dy.data_ptr<float>() + r0 * c.h, g, r + r0,
                     dx.data_ptr<float>() + r0 * c.h, dg, w.data(), dn.data(), n);
      } else {
        backward_bf16(c, x.data_ptr<at::BFloat16>() + r0 * c.h,
                      dy.data_ptr<at::BFloat16>() + r0 * c.h, g, r + r0,
                      dx.data_ptr<at::BFloat16>() + r0 * c.h, dg, w.data(), dn.data(), n);
      }
    }
  });
}

at::Tensor composite(const at::Tensor& x, const at::Tensor& gamma, double epsilon,
                     bool zero_centered_gamma) {
  const at::Tensor xf = x.scalar_type() == at::kDouble ? x : x.to(at::kFloat);
  const at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean({-1}, /*keepdim=*/true) + epsilon);
  return zero_centered_gamma ? (normed * (gamma.to(normed.scalar_type()) + 1.0)).to(x.scalar_type())
                             : normed.to(x.scalar_type()) * gamma;
}

class RmsNorm : public torch::autograd::Function<RmsNorm> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x_in,
                            const at::Tensor& gamma, double epsilon, bool zero_centered) {
    const at::Tensor x = x_in.contiguous();
    const int64_t h = x.size(-1), rows = h == 0 ? 0 : x.numel() / h;
    at::Tensor y = at::empty_like(x);
    at::Tensor r = at::empty({rows}, x.options().dtype(at::kFloat));
    if (!x.is_meta() && rows > 0) {
      const at::Tensor g = gamma.to(at::kFloat).contiguous();
      forward_rows({h, static_cast<float>(epsilon), zero_centered}, x, g.data_ptr<float>(), y,
                   r.data_ptr<float>(), rows);
    }
    ctx->save_for_backward({x_in, gamma, r});
    ctx->saved_data["epsilon"] = epsilon;
    ctx->saved_data["zero_centered"] = zero_centered;
    return y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const double epsilon = ctx->saved_data["epsilon"].toDouble();
    const bool zero_centered = ctx->saved_data["zero_centered"].toBool();
    const at::Tensor &x_in = saved[0], &gamma = saved[1], &r = saved[2];
    if (at::GradMode::is_enabled()) {  // a backward that builds a graph: the composite's
      std::vector<at::Tensor> inputs;
      for (const at::Tensor& t : {x_in, gamma}) {
        if (t.requires_grad()) inputs.push_back(t);
      }
      if (inputs.empty()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
      const auto d = torch::autograd::grad({composite(x_in, gamma, epsilon, zero_centered)}, inputs,
                                           {grads[0]}, /*retain_graph=*/true,
                                           /*create_graph=*/true);
      const bool dx = x_in.requires_grad();
      return {dx ? d[0] : at::Tensor(), gamma.requires_grad() ? d.back() : at::Tensor(),
              at::Tensor(), at::Tensor()};
    }
    const at::Tensor x = x_in.contiguous(), dy = grads[0].to(x.scalar_type()).contiguous();
    const int64_t h = x.size(-1), rows = h == 0 ? 0 : x.numel() / h;
    const int64_t blocks = (rows + kRows - 1) / kRows;
    at::Tensor dx = at::empty_like(x);
    at::Tensor partials = at::empty({blocks, h}, x.options().dtype(at::kFloat));
    at::Tensor dgamma = at::empty_like(gamma);
    if (!x.is_meta()) {
      const at::Tensor g = gamma.to(at::kFloat).contiguous();
      backward_rows({h, static_cast<float>(epsilon), zero_centered}, x, dy, g.data_ptr<float>(),
                    r.data_ptr<float>(), dx, partials.data_ptr<float>(), rows);
      // The blocks' partials summed in block order (at::sum would reorder them by threads).
      at::Tensor total = at::zeros({h}, x.options().dtype(at::kFloat));
      float* t = total.data_ptr<float>();
      const float* p = partials.data_ptr<float>();
      for (int64_t b = 0; b < blocks; ++b) {
        for (int64_t i = 0; i < h; ++i) t[i] += p[b * h + i];
      }
      dgamma.copy_(total);
    }
    return {dx, dgamma, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool cpu_rms_norm_fused(const at::Tensor& x, const at::Tensor& gamma) {
  const at::ScalarType type = x.scalar_type();
  return (x.device().is_cpu() || x.is_meta()) && x.layout() == at::kStrided && x.dim() >= 1 &&
         (type == at::kFloat || type == at::kBFloat16) && gamma.scalar_type() == type &&
         gamma.device() == x.device() && gamma.dim() == 1 && gamma.size(0) == x.size(-1);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& gamma, double epsilon,
                    bool zero_centered_gamma) {
  if (!cpu_rms_norm_fused(x, gamma)) return composite(x, gamma, epsilon, zero_centered_gamma);
  return RmsNorm::apply(x, gamma, epsilon, zero_centered_gamma);
}

}  // namespace te::nn::functional::detail
