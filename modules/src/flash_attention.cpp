#include "flash_attention.h"

// Fused attention on the CPU, FlashAttention-2's algorithm (Dao 2023, Algorithms 1 and 2): each
// task takes a block of query rows of one head, walks the key blocks its window reaches with a
// running maximum and sum, and never holds a [seqlen_q, seqlen_kv] matrix; backward recomputes
// each block's probabilities from the saved log-sum-exp. Why te has its own: LibTorch 1.13 has no
// fused CPU attention, and the unfused path (two batched GEMMs, a softmax over every logit,
// causal ones included) cost a training step 1.7x the time of PyTorch 2.11's CPU flash kernel
// (docs/results.md). The block products go to the BLAS LibTorch calls (one thread each: the tasks
// are spread over LibTorch's threads); the row loops are compiled for
// AVX-512, AVX2 and the baseline and chosen at load time. Every product is in float32 (bf16 and
// fp16 inputs are widened once), as TE's fused kernels accumulate.

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include "te/runtime/parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention_piece.h"
#include "cpu_loops.h"
#include "fast_exp.h"
#include "te/error.h"
#include "te/nn/functional.h"

namespace te::nn::functional::detail {

namespace {

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__)
#define TE_FLASH_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define TE_FLASH_INLINE __attribute__((always_inline)) inline
#else
#define TE_FLASH_CLONES
#define TE_FLASH_INLINE inline
#endif

// Query rows a task takes; keys a step of the forward takes (128: its two products ~15% faster
// than at 64 here) and of the backward (64: its five products ~25% slower at 128).
constexpr int64_t kBlockQ = 64, kForwardKeys = 128, kBackwardKeys = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kNone = std::numeric_limits<int64_t>::max() / 4;  // an unbounded window side

#if TE_HAVE_BLAS
extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n,
                       const int* k, const float* alpha, const float* a, const int* lda,
                       const float* b, const int* ldb, const float* beta, float* c, const int* ldc);
#endif

// Row-major C[m x n] = alpha op(A) op(B) + beta C (a block: every size far below 2^31).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
#if TE_HAVE_BLAS
  // Column-major BLAS: the same call on the transposes, C^T = op(B)^T op(A)^T.
  const char ta = trans_a ? 'T' : 'N', tb = trans_b ? 'T' : 'N';
  const int mm = static_cast<int>(n), nn = static_cast<int>(m), kk = static_cast<int>(k);
  const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
  sgemm_(&tb, &ta, &mm, &nn, &kk, &alpha, b, &la, a, &lb, &beta, c, &lc);
#else
  const auto opts = at::TensorOptions().dtype(at::kFloat);
  const auto view = [&](const float* p, bool trans, int64_t rows, int64_t cols, int64_t ld) {
    const at::Tensor t = at::from_blob(const_cast<float*>(p),
                                       {trans ? cols : rows, trans ? rows : cols}, {ld, 1}, opts);
    return trans ? t.t() : t;
  };
  at::Tensor out = at::from_blob(c, {m, n}, {ldc, 1}, opts);
  if (beta == 0.f) {
    at::mm_out(out, view(a, trans_a, m, k, lda), view(b, trans_b, k, n, ldb));
    if (alpha != 1.f) out.mul_(alpha);
  } else {
    out.addmm_(view(a, trans_a, m, k, lda), view(b, trans_b, k, n, ldb), beta, alpha);
  }
#endif
}

// exp(v) for v <= 0 (up to rounding), NaN kept: a NaN or infinite logit makes its row NaN, as the
// softmax of it does (fp16's loss scaling counts on seeing it).
TE_FLASH_INLINE float exp_kept(float v) { return v == v ? exp_nonpositive(v) : v; }

// One row of a block of logits s[0, cols): the columns outside [lo, hi] hidden; the row's running
// maximum *m and sum *l updated; s replaced by exp(s - new maximum); the row's accumulated output
// acc[0, dv) rescaled to the new maximum.
TE_FLASH_CLONES void softmax_row(float* s, int64_t cols, int64_t lo, int64_t hi, float* m, float* l,
                                 float* acc, int64_t dv) {
  for (int64_t c = 0; c < std::min(lo, cols); ++c) s[c] = kNegInf;
  for (int64_t c = std::max<int64_t>(hi + 1, 0); c < cols; ++c) s[c] = kNegInf;
  // (GCC's vector type: the maximum of 16 lanes at once, in every clone.)
  typedef float Lanes __attribute__((vector_size(64)));
  Lanes part = *m + Lanes{};
  int64_t c = 0;
  for (; c + 16 <= cols; c += 16) {
    Lanes x;
    std::memcpy(&x, s + c, sizeof x);
    part = x > part ? x : part;
  }
  float top = *m;
  for (int u = 0; u < 16; ++u) top = part[u] > top ? part[u] : top;
  for (; c < cols; ++c) top = s[c] > top ? s[c] : top;
  // (A NaN logit is skipped by the maximum, and its exp below makes the row's sum NaN.)
  if (top == kNegInf) {  // nothing visible yet: no weight, unless a NaN hides among -infs
    const bool nan = std::any_of(s, s + cols, [](float x) { return x != x; });
    std::fill(s, s + cols, nan ? std::numeric_limits<float>::quiet_NaN() : 0.f);
    if (nan) *l = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  const float alpha = exp_kept(*m - top);
  float sums[16] = {};
  c = 0;
  for (; c + 16 <= cols; c += 16) {
    for (int u = 0; u < 16; ++u) {
      s[c + u] = exp_kept(s[c + u] - top);
      sums[u] += s[c + u];
    }
  }
  float sum = 0.f;
  for (; c < cols; ++c) {
    s[c] = exp_kept(s[c] - top);
    sum += s[c];
  }
  for (const float x : sums) sum += x;
  *l = *l * alpha + sum;
  *m = top;
  if (alpha != 1.f) {
    for (int64_t e = 0; e < dv; ++e) acc[e] *= alpha;
  }
}

// Backward's probabilities: s = exp(s - lse) over [lo, hi], 0 elsewhere (and everywhere in a row
// that sees no key, lse -inf).
TE_FLASH_CLONES void probs_row(float* s, int64_t cols, int64_t lo, int64_t hi, float lse) {
  if (lse == kNegInf) {
    std::fill(s, s + cols, 0.f);
    return;
  }
  for (int64_t c = 0; c < cols; ++c) {
    const float p = exp_kept(s[c] - lse);
    s[c] = c >= lo && c <= hi ? p : 0.f;
  }
}

// dS = P (dP - D), into dp.
TE_FLASH_CLONES void ds_row(const float* p, float* dp, int64_t cols, float d) {
  for (int64_t c = 0; c < cols; ++c) dp[c] = p[c] * (dp[c] - d);
}

TE_FLASH_CLONES float dot(const float* a, const float* b, int64_t n) { return dot16(a, b, n); }

// The shapes of one call, and where query row i's visible keys are.
struct Geometry {
  int64_t b, sq, sk, h, hkv, d, dv;
  KeyWindow w;
  int64_t first_key(int64_t i) const { return w.left >= 0 ? i + w.offset - w.left : -kNone; }
  int64_t last_key(int64_t i) const { return w.right >= 0 ? i + w.offset + w.right : kNone; }
  int64_t query_blocks() const { return (sq + kBlockQ - 1) / kBlockQ; }
  // The keys [begin, end) some row of the query block at i0 (rows rows) sees; empty when none.
  std::pair<int64_t, int64_t> keys(int64_t i0, int64_t rows) const {
    return {std::max<int64_t>(0, first_key(i0)),
            std::min<int64_t>(sk, last_key(i0 + rows - 1) + 1)};
  }
};

// One query block of one head, at q/k/v/out positions of the call: the running softmax over the
// key blocks, then the output rows and their log-sum-exp.
void forward_block(const Geometry& g, float scale, const float* q, const float* k, const float* v,
                   float* out, float* lse, int64_t bb, int64_t hq, int64_t i0,
                   std::vector<float>& s, std::vector<float>& acc, std::vector<float>& m,
                   std::vector<float>& l) {
  const int64_t rows = std::min(kBlockQ, g.sq - i0), hk = hq / (g.h / g.hkv);
  const int64_t ldq = g.h * g.d, ldk = g.hkv * g.d, ldv = g.hkv * g.dv;
  const float* Q = q + ((bb * g.sq + i0) * g.h + hq) * g.d;
  const float* K = k + (bb * g.sk * g.hkv + hk) * g.d;
  const float* V = v + (bb * g.sk * g.hkv + hk) * g.dv;
  std::fill(m.begin(), m.end(), kNegInf);
  std::fill(l.begin(), l.end(), 0.f);
  std::fill(acc.begin(), acc.end(), 0.f);
  const auto [begin, end] = g.keys(i0, rows);
  for (int64_t j0 = begin; j0 < end; j0 += kForwardKeys) {
    const int64_t cols = std::min(kForwardKeys, end - j0);
    gemm(false, true, rows, cols, g.d, scale, Q, ldq, K + j0 * ldk, ldk, 0.f, s.data(),
         kForwardKeys);
    for (int64_t r = 0; r < rows; ++r) {
      softmax_row(s.data() + r * kForwardKeys, cols, g.first_key(i0 + r) - j0,
                  g.last_key(i0 + r) - j0, &m[r], &l[r], acc.data() + r * g.dv, g.dv);
    }
    gemm(false, false, rows, g.dv, cols, 1.f, s.data(), kForwardKeys, V + j0 * ldv, ldv, 1.f,
         acc.data(), g.dv);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + ((bb * g.sq + i0 + r) * g.h + hq) * g.dv;
    float& row_lse = lse[(bb * g.h + hq) * g.sq + i0 + r];
    if (l[r] > 0.f || l[r] != l[r]) {
      const float inv = 1.f / l[r];
      for (int64_t e = 0; e < g.dv; ++e) o[e] = acc[r * g.dv + e] * inv;
      row_lse = m[r] + std::log(l[r]);
    } else {  // no key: a zero row
      std::fill(o, o + g.dv, 0.f);
      row_lse = kNegInf;
    }
  }
}

void forward_kernel(const Geometry& g, float scale, const float* q, const float* k, const float* v,
                    float* out, float* lse) {
  const int64_t blocks = g.query_blocks();
  at::parallel_for(0, g.b * g.h * blocks, 1, [&](int64_t first, int64_t last) {
    std::vector<float> s(kBlockQ * kForwardKeys), acc(kBlockQ * g.dv), m(kBlockQ), l(kBlockQ);
    for (int64_t t = first; t < last; ++t) {
      const int64_t i0 = (t % blocks) * kBlockQ, hq = (t / blocks) % g.h, bb = t / (blocks * g.h);
      forward_block(g, scale, q, k, v, out, lse, bb, hq, i0, s, acc, m, l);
    }
  });
}

// Backward's operands (float32, contiguous): the forward's and the gradients it is given, and the
// gradients it writes (dk, dv per query head: [b, sk, h, d | dv]).
struct Backward {
  const float *q, *k, *v, *out, *dout, *lse, *dlse;  // dlse may be null
  float *dq, *dk, *dv;
};

// One head of one batch row: the gradients of its queries, and its own share of its key/value
// head's gradients (summed over the group after).
void backward_head(const Geometry& g, float scale, const Backward& x, int64_t bb, int64_t hq,
                   std::vector<float>& s, std::vector<float>& dp, std::vector<float>& delta) {
  const float *q = x.q, *out = x.out, *dout = x.dout;
  const int64_t hk = hq / (g.h / g.hkv);
  const int64_t ldq = g.h * g.d, ldk = g.hkv * g.d, ldv = g.hkv * g.dv, ldo = g.h * g.dv;
  const float* K = x.k + (bb * g.sk * g.hkv + hk) * g.d;
  const float* V = x.v + (bb * g.sk * g.hkv + hk) * g.dv;
  float* dK = x.dk + (bb * g.sk * g.h + hq) * g.d;
  float* dV = x.dv + (bb * g.sk * g.h + hq) * g.dv;
  const float* L = x.lse + (bb * g.h + hq) * g.sq;
  // D = rowsum(dO o O) (minus the log-sum-exp's own gradient: d lse / d s = P).
  for (int64_t i = 0; i < g.sq; ++i) {
    const int64_t at_row = (bb * g.sq + i) * g.h + hq;
    delta[i] = dot(dout + at_row * g.dv, out + at_row * g.dv, g.dv) -
               (x.dlse != nullptr ? x.dlse[(bb * g.h + hq) * g.sq + i] : 0.f);
  }
  for (int64_t i0 = 0; i0 < g.sq; i0 += kBlockQ) {
    const int64_t rows = std::min(kBlockQ, g.sq - i0);
    const float* Q = q + ((bb * g.sq + i0) * g.h + hq) * g.d;
    const float* dO = dout + ((bb * g.sq + i0) * g.h + hq) * g.dv;
    float* dQ = x.dq + ((bb * g.sq + i0) * g.h + hq) * g.d;
    const auto [begin, end] = g.keys(i0, rows);
    for (int64_t j0 = begin; j0 < end; j0 += kBackwardKeys) {
      const int64_t cols = std::min(kBackwardKeys, end - j0);
      gemm(false, true, rows, cols, g.d, scale, Q, ldq, K + j0 * ldk, ldk, 0.f, s.data(),
           kBackwardKeys);
      for (int64_t r = 0; r < rows; ++r) {
        probs_row(s.data() + r * kBackwardKeys, cols, g.first_key(i0 + r) - j0,
                  g.last_key(i0 + r) - j0, L[i0 + r]);
      }
      gemm(true, false, cols, g.dv, rows, 1.f, s.data(), kBackwardKeys, dO, ldo, 1.f,
           dV + j0 * g.h * g.dv, g.h * g.dv);
      gemm(false, true, rows, cols, g.dv, 1.f, dO, ldo, V + j0 * ldv, ldv, 0.f, dp.data(),
           kBackwardKeys);
      for (int64_t r = 0; r < rows; ++r) {
        ds_row(s.data() + r * kBackwardKeys, dp.data() + r * kBackwardKeys, cols, delta[i0 + r]);
      }
      gemm(false, false, rows, g.d, cols, scale, dp.data(), kBackwardKeys, K + j0 * ldk, ldk, 1.f,
           dQ, ldq);
      gemm(true, false, cols, g.d, rows, scale, dp.data(), kBackwardKeys, Q, ldq, 1.f,
           dK + j0 * g.h * g.d, g.h * g.d);
    }
  }
}

Geometry geometry(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, KeyWindow w) {
  return {q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3), w};
}

// float32 and contiguous (a copy only where it is not already).
at::Tensor widened(const at::Tensor& t) { return t.to(at::kFloat).contiguous(); }

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct FlashAttention : public torch::autograd::Function<FlashAttention> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, double scale, int64_t offset, int64_t left,
                               int64_t right) {
    auto [out, lse] = flash_forward(q, k, v, scale, {offset, left, right});
    out = out.to(q.scalar_type());
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["window"] = std::vector<int64_t>{offset, left, right};
    return {out, lse};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const std::vector<int64_t> w = ctx->saved_data["window"].toIntVector();
    const at::Tensor dout = grads[0].defined() ? grads[0] : at::zeros_like(saved[3]);
    auto [dq, dk, dv] = flash_backward(q, k, v, saved[3], dout, saved[4], grads[1],
                                       ctx->saved_data["scale"].toDouble(), {w[0], w[1], w[2]});
    return {dq.to(q.scalar_type()),
            dk.to(k.scalar_type()),
            dv.to(v.scalar_type()),
            at::Tensor(),
            at::Tensor(),
            at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

std::pair<at::Tensor, at::Tensor> flash_forward(const at::Tensor& q, const at::Tensor& k,
                                                const at::Tensor& v, double scale,
                                                KeyWindow window) {
  const Geometry g = geometry(q, k, v, window);
  const at::Tensor qf = widened(q), kf = widened(k), vf = widened(v);
  at::Tensor out = at::empty({g.b, g.sq, g.h, g.dv}, qf.options());
  const at::Tensor lse = at::empty({g.b, g.h, g.sq}, qf.options());
  if (!q.is_meta() && out.numel() > 0) {  // (te::nn::plan: shapes and allocations only)
    forward_kernel(g, static_cast<float>(scale), qf.data_ptr<float>(), kf.data_ptr<float>(),
                   vf.data_ptr<float>(), out.data_ptr<float>(), lse.data_ptr<float>());
  } else if (!q.is_meta()) {
    lse.fill_(kNegInf);
  }
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> flash_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& dlse, double scale,
    KeyWindow window) {
  const Geometry g = geometry(q, k, v, window);
  const at::Tensor qf = widened(q), kf = widened(k), vf = widened(v), of = widened(out);
  const at::Tensor dof = widened(dout), lf = widened(lse);
  const at::Tensor dlf = dlse.defined() ? widened(dlse) : at::Tensor();
  const at::Tensor dq = at::zeros_like(qf);
  at::Tensor dk = at::zeros({g.b, g.sk, g.h, g.d}, qf.options());
  at::Tensor dv = at::zeros({g.b, g.sk, g.h, g.dv}, qf.options());
  if (!q.is_meta() && dq.numel() > 0 && g.sk > 0) {
    const Backward x{qf.data_ptr<float>(),
                     kf.data_ptr<float>(),
                     vf.data_ptr<float>(),
                     of.data_ptr<float>(),
                     dof.data_ptr<float>(),
                     lf.data_ptr<float>(),
                     dlf.defined() ? dlf.data_ptr<float>() : nullptr,
                     dq.data_ptr<float>(),
                     dk.data_ptr<float>(),
                     dv.data_ptr<float>()};
    const float s = static_cast<float>(scale);
    at::parallel_for(0, g.b * g.h, 1, [&](int64_t first, int64_t last) {
      std::vector<float> sb(kBlockQ * kBackwardKeys), dp(kBlockQ * kBackwardKeys), delta(g.sq);
      for (int64_t t = first; t < last; ++t)
        backward_head(g, s, x, t / g.h, t % g.h, sb, dp, delta);
    });
  }
  if (g.h != g.hkv) {  // each key/value head's gradient: the sum over its query heads
    dk = dk.view({g.b, g.sk, g.hkv, g.h / g.hkv, g.d}).sum(3);
    dv = dv.view({g.b, g.sk, g.hkv, g.h / g.hkv, g.dv}).sum(3);
  }
  return {dq, dk, dv};
}

bool flash_attention_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const AttentionCall& call) {
  const at::ScalarType type = q.scalar_type();
  return call.fused && (q.device().is_cpu() || q.is_meta()) && q.dim() == 4 &&
         (type == at::kFloat || type == at::kBFloat16 || type == at::kHalf) &&
         k.scalar_type() == type && v.scalar_type() == type && k.device() == q.device() &&
         v.device() == q.device() && !(call.training && call.dropout > 0.0) &&
         call.bias_type == AttnBiasType::kNoBias && call.softmax_type == SoftmaxType::kVanilla &&
         call.softcap == 0.0 && !piece_of(call).on_logits && !call.spec.takes_mask();
}

KeyWindow key_window(const AttentionCall& call, int64_t sq, int64_t sk) {
  const MaskSpec& spec = call.spec;
  if (!spec.windowed()) return {};
  return {spec.bottom_right ? sk - sq : 0, spec.window_left, spec.causal() ? 0 : spec.window_right};
}

std::pair<at::Tensor, at::Tensor> flash_attention(const at::Tensor& q, const at::Tensor& k,
                                                  const at::Tensor& v, double scale,
                                                  KeyWindow window) {
  TE_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(0) == k.size(0) &&
               k.sizes().slice(0, 3) == v.sizes().slice(0, 3) && q.size(3) == k.size(3) &&
               k.size(2) > 0 && q.size(2) % k.size(2) == 0,
           "flash_attention: q ", q.sizes(), ", k ", k.sizes(), ", v ", v.sizes(),
           " are not [b, sq, h, d], [b, sk, hkv, d], [b, sk, hkv, dv] with h a multiple of hkv");
  const variable_list r =
      FlashAttention::apply(q, k, v, scale, window.offset, window.left, window.right);
  return {r[0], r[1]};
}

}  // namespace te::nn::functional::detail
