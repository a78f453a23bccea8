// Attention over a paged KV cache on the CPU (functional::paged_attention): each query row reads
// its sequence's keys and values through the page table, with vectorised inner loops.

#include <ATen/ATen.h>
#include "te/runtime/parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "te/error.h"
#include "te/nn/functional.h"

namespace te::nn::functional {
// ---- attention over a paged KV cache ----------------------------------------------------------

namespace {

// The kernel's two inner loops, a . b and y += p x over n elements, in eight partial sums the
// compiler vectorizes; on x86-64 GCC also builds AVX2 + FMA clones, chosen at load time by what
// the CPU has (function multiversioning), the build itself staying baseline x86-64. The clone is
// "arch=x86-64-v3" (a feature level: AVX2, FMA, ...): "arch=haswell" is chosen only on Intel
// Haswell-family CPUs, so AMD ones ran the baseline loops. (GCC 12 on: older ones lack the level.)
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12 && defined(__x86_64__)
#define TE_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#define TE_INLINE __attribute__((always_inline)) inline
#else
#define TE_VECTOR_CLONES
#define TE_INLINE inline
#endif
// (Inlined into each clone, so each is compiled for its target.)
template <typename scalar_t>
TE_INLINE scalar_t dot_body(const scalar_t* a, const scalar_t* b, int64_t n) {
  scalar_t acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int u = 0; u < 8; ++u) acc[u] += a[i + u] * b[i + u];
  }
  scalar_t sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}
TE_VECTOR_CLONES float dot(const float* a, const float* b, int64_t n) { return dot_body(a, b, n); }
TE_VECTOR_CLONES double dot(const double* a, const double* b, int64_t n) {
  return dot_body(a, b, n);
}
TE_VECTOR_CLONES void axpy(float p, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += p * x[i];
}
TE_VECTOR_CLONES void axpy(double p, const double* x, double* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += p * x[i];
}

// One (sequence, key/value head) at a time: its group of query heads read each cached key and
// value row once, straight from the pool.
template <typename scalar_t>
void paged_attention_cpu(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                         const at::Tensor& rows, const at::Tensor& cu_q, const at::Tensor& len_kv,
                         const AttentionCall& call, at::Tensor& out) {
  const int64_t heads = q.size(1), d = q.size(2), kv_heads = k_pool.size(1), dv = v_pool.size(2),
                group = heads / kv_heads, n = len_kv.size(0), max_kv = rows.size(1);
  const scalar_t* qp = q.data_ptr<scalar_t>();
  const scalar_t* kp = k_pool.data_ptr<scalar_t>();
  const scalar_t* vp = v_pool.data_ptr<scalar_t>();
  const int64_t* rp = rows.data_ptr<int64_t>();
  const int64_t* cq = cu_q.data_ptr<int64_t>();
  const int64_t* lkv = len_kv.data_ptr<int64_t>();
  scalar_t* op = out.data_ptr<scalar_t>();
  const MaskSpec& spec = call.spec;
  const int64_t right = spec.causal() ? 0 : spec.window_right;
  const bool sink = call.softmax_type != SoftmaxType::kVanilla;
  std::vector<float> sinks(static_cast<std::size_t>(heads), 0.0f);
  if (call.softmax_type == SoftmaxType::kLearnable) {
    const at::Tensor o = call.softmax_offset.to(at::kCPU, at::kFloat).contiguous();
    std::copy(o.data_ptr<float>(), o.data_ptr<float>() + heads, sinks.begin());
  }
  const auto scale = static_cast<scalar_t>(call.scale);
  const auto cap = static_cast<scalar_t>(call.softcap);  // > 0: cap * tanh(logit / cap)
  at::parallel_for(0, n * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<scalar_t> scores(static_cast<std::size_t>(group * max_kv));
    std::vector<scalar_t> acc(static_cast<std::size_t>(group * dv));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / kv_heads, g = task % kv_heads;
      const int64_t lq = cq[i + 1] - cq[i], lk = lkv[i];
      const int64_t offset = spec.bottom_right ? lk - lq : 0;
      const int64_t* seq_rows = rp + i * max_kv;
      for (int64_t t = 0; t < lq; ++t) {
        // Query t sees keys t + offset - left ... t + offset + right (MaskSpec).
        const int64_t at = t + offset;
        const int64_t lo = spec.window_left >= 0 ? std::max<int64_t>(0, at - spec.window_left) : 0;
        const int64_t hi = right >= 0 ? std::min(lk - 1, at + right) : lk - 1;
        const int64_t token = cq[i] + t;
        if (lo > hi) continue;  // sees no key: a zero row, as every TE backend gives it
        const scalar_t* qt = qp + (token * heads + g * group) * d;
        for (int64_t j = lo; j <= hi; ++j) {
          const scalar_t* kj = kp + (seq_rows[j] * kv_heads + g) * d;
          for (int64_t r = 0; r < group; ++r) {
            const scalar_t logit = dot(qt + r * d, kj, d) * scale;
            scores[static_cast<std::size_t>(r * max_kv + j)] =
                cap > 0 ? cap * std::tanh(logit / cap) : logit;
          }
        }
        std::fill(acc.begin(), acc.end(), scalar_t(0));
        std::vector<scalar_t> total(static_cast<std::size_t>(group));
        for (int64_t r = 0; r < group; ++r) {
          scalar_t* sr = scores.data() + r * max_kv;
          const scalar_t sink_logit =
              sink ? static_cast<scalar_t>(sinks[static_cast<std::size_t>(g * group + r)]) : 0;
          scalar_t top = sink ? sink_logit : -std::numeric_limits<scalar_t>::infinity();
          for (int64_t j = lo; j <= hi; ++j) top = std::max(top, sr[j]);
          scalar_t sum = sink ? std::exp(sink_logit - top) : 0;
          for (int64_t j = lo; j <= hi; ++j) {
            sr[j] = std::exp(sr[j] - top);
            sum += sr[j];
          }
          total[static_cast<std::size_t>(r)] = sum;
        }
        for (int64_t j = lo; j <= hi; ++j) {
          const scalar_t* vj = vp + (seq_rows[j] * kv_heads + g) * dv;
          for (int64_t r = 0; r < group; ++r) {
            const scalar_t p = scores[static_cast<std::size_t>(r * max_kv + j)];
            axpy(p, vj, acc.data() + r * dv, dv);
          }
        }
        for (int64_t r = 0; r < group; ++r) {
          scalar_t* o = op + (token * heads + g * group + r) * dv;
          const scalar_t inv = scalar_t(1) / total[static_cast<std::size_t>(r)];
          for (int64_t c = 0; c < dv; ++c) o[c] = acc[static_cast<std::size_t>(r * dv + c)] * inv;
        }
      }
    }
  });
}

}  // namespace

bool paged_attention_supported(const at::Tensor& q, const at::Tensor& k_pool) {
  return q.is_cpu() && k_pool.is_cpu() && q.scalar_type() == k_pool.scalar_type() &&
         (q.scalar_type() == at::kFloat || q.scalar_type() == at::kDouble);
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                           const at::Tensor& kv_rows, const at::Tensor& cu_seqlens_q,
                           const at::Tensor& seqlens_kv, const AttentionCall& call) {
  TE_CHECK(paged_attention_supported(q, k_pool) && v_pool.scalar_type() == q.scalar_type() &&
               v_pool.is_cpu(),
           "paged_attention: q ", q.scalar_type(), " on ", q.device(), " and the pools ",
           k_pool.scalar_type(), " on ", k_pool.device(),
           " must be float32 or float64 CPU tensors of one dtype");
  TE_CHECK(q.dim() == 3 && k_pool.dim() == 3 && v_pool.dim() == 3 && k_pool.size(2) == q.size(2) &&
               v_pool.size(1) == k_pool.size(1) && v_pool.size(0) == k_pool.size(0) &&
               q.size(1) % k_pool.size(1) == 0,
           "paged_attention: q ", q.sizes(), " [tokens, heads, d], k_pool ", k_pool.sizes(),
           " and v_pool ", v_pool.sizes(), " [rows, kv heads, d] do not fit");
  const int64_t n = seqlens_kv.size(0);
  TE_CHECK(kv_rows.dim() == 2 && kv_rows.size(0) == n && cu_seqlens_q.numel() == n + 1,
           "paged_attention: kv_rows ", kv_rows.sizes(), ", cu_seqlens_q ", cu_seqlens_q.sizes(),
           " and seqlens_kv ", seqlens_kv.sizes(), " do not describe ", n, " sequences");
  TE_CHECK(call.bias_type == AttnBiasType::kNoBias && !(call.training && call.dropout > 0),
           "paged_attention: no bias and no dropout (inference)");
  const at::Tensor rows = kv_rows.to(at::kLong).contiguous();
  const at::Tensor cu = cu_seqlens_q.to(at::kLong).contiguous();
  const at::Tensor lens = seqlens_kv.to(at::kLong).contiguous();
  const int64_t* c = cu.data_ptr<int64_t>();
  const int64_t* l = lens.data_ptr<int64_t>();
  TE_CHECK(c[0] == 0 && c[n] == q.size(0), "paged_attention: cu_seqlens_q must run from 0 to the ",
           q.size(0), " tokens");
  for (int64_t i = 0; i < n; ++i) {
    TE_CHECK(c[i + 1] >= c[i] && l[i] >= 0 && l[i] <= rows.size(1), "paged_attention: sequence ", i,
             " has ", c[i + 1] - c[i], " queries and ", l[i], " keys (at most ", rows.size(1), ")");
  }
  at::Tensor out = at::zeros({q.size(0), q.size(1), v_pool.size(2)}, q.options());
  const at::Tensor qc = q.contiguous(), kc = k_pool.contiguous(), vc = v_pool.contiguous();
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "paged_attention", [&] {
    paged_attention_cpu<scalar_t>(qc, kc, vc, rows, cu, lens, call, out);
  });
  return out;
}

}  // namespace te::nn::functional
