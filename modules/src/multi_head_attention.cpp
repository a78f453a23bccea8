// MultiHeadAttention: TE's projections (fused or separate QKV, GQA, qk-norm, RoPE, biases) around
// DotProductAttention, one forward body for plain tensors and DTensors (modules/src/forward.h).

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <cmath>
#include "attention_detail.h"
#include "constrain.h"
#include "forward.h"
#include "te/compat.h"
#include "te/error.h"
#include "te/fp8.h"
#include "te/nn/attention.h"
#include "te/nn/functional.h"
#include "te/nn/init.h"

namespace te::nn {

namespace F = functional;

// ---- MultiHeadAttention ----------------------------------------------------------------------

MultiHeadAttentionImpl::MultiHeadAttentionImpl(const MultiHeadAttentionOptions& options_)
    : options(options_) {
  reset();
}

int64_t MultiHeadAttentionImpl::head_dim() const {
  const DotProductAttentionOptions& a = options.attention();
  return a.head_dim() != 0 ? a.head_dim() : options.hidden_size() / a.num_attention_heads();
}

int64_t MultiHeadAttentionImpl::kv_heads() const {
  const DotProductAttentionOptions& a = options.attention();
  return a.num_gqa_groups() != 0 ? a.num_gqa_groups() : a.num_attention_heads();
}

namespace {

// What MultiHeadAttention's options must satisfy before anything is built.
void check_mha_options(const MultiHeadAttentionOptions& o, int64_t kv_heads) {
  const DotProductAttentionOptions& a = o.attention();
  const int64_t hidden = o.hidden_size(), heads = a.num_attention_heads();
  TE_CHECK(hidden > 0 && heads > 0, "MultiHeadAttention: hidden_size (", hidden,
           ") and num_attention_heads (", heads, ") must be positive");
  TE_CHECK(a.head_dim() >= 0 && (a.head_dim() != 0 || hidden % heads == 0),
           "MultiHeadAttention: hidden_size ", hidden, " is not a multiple of num_attention_heads ",
           heads, "; set attention().head_dim explicitly");
  TE_CHECK(kv_heads > 0 && heads % kv_heads == 0, "MultiHeadAttention: ", heads,
           " heads are not a multiple of num_gqa_groups ", kv_heads);
  TE_CHECK(a.head_dim_v() == 0, "MultiHeadAttention: attention().head_dim_v ", a.head_dim_v(),
           " is DotProductAttention's only (the projections give values of head_dim): leave it 0");
  const QkvFormat format = a.qkv_format();
  TE_CHECK(format != QkvFormat::kSbhd,
           "MultiHeadAttention: qkv_format 'sbhd' is not 'bshd' or 'thd' ('sbhd' is "
           "DotProductAttention's only)");
  TE_CHECK(format != QkvFormat::kThd || o.self_attention(),
           "MultiHeadAttention: qkv_format 'thd' is for self attention; cross attention takes "
           "bshd here");
  TE_CHECK(!o.qk_norm_over_heads() || o.qk_norm_type() == QkNormType::kRMSNorm ||
               o.qk_norm_type() == QkNormType::kLayerNorm,
           "MultiHeadAttention: qk_norm_over_heads needs a qk_norm_type with a scale (RMSNorm or "
           "LayerNorm), not ",
           o.qk_norm_type());
  TE_CHECK(std::isfinite(o.clip_qkv()) && o.clip_qkv() >= 0, "MultiHeadAttention: clip_qkv ",
           o.clip_qkv(), " must be finite and at least 0 (0: no clipping)");
  TE_CHECK(format != QkvFormat::kThd || !o.enable_sequence_parallel(),
           "MultiHeadAttention: qkv_format 'thd' with enable_sequence_parallel is not supported "
           "(sequence parallel splits the packed tokens): shard the heads only");
}

}  // namespace

// The projections' kernels and biases. TE's attention kernels: variance_scaling(1, fan_in,
// normal); the query part divided by sqrt(head_dim) when scaled_query_init (then the logits are
// not scaled). A bias takes its kernel's output axes (all but the first).
void MultiHeadAttentionImpl::register_projections() {
  const MultiHeadAttentionOptions& o = options;
  const int64_t hidden = o.hidden_size(), heads = o.attention().num_attention_heads();
  const int64_t d = head_dim(), g = kv_heads();
  const double query_scale = o.scaled_query_init() ? 1.0 / std::sqrt(double(d)) : 1.0;
  auto kernel = [&](std::vector<int64_t> shape) {
    return variance_scaling(shape, 1, 1.0, "fan_in", "normal");
  };
  auto output_axes = [](const LogicalAxes& kernel_axes) {
    return LogicalAxes(kernel_axes.begin() + 1, kernel_axes.end());
  };
  const bool qkv_bias_on = o.qkv_bias().value_or(o.use_bias());
  if (o.self_attention() && o.fuse_qkv() && g == heads) {
    at::Tensor w = kernel({hidden, 3, heads * d});
    w.select(1, 0).mul_(query_scale);
    qkv_kernel = register_sharded(*this, "qkv_kernel", w, o.qkv_kernel_axes());
    qkv_fp8 = register_fp8_gemm(*this, "qkv_");
    if (qkv_bias_on) {
      qkv_bias = register_sharded(*this, "qkv_bias", at::zeros({3, heads * d}),
                                  output_axes(o.qkv_kernel_axes()));
    }
  } else {
    q_kernel = register_sharded(*this, "q_kernel", kernel({hidden, heads * d}) * query_scale,
                                o.q_kernel_axes());
    kv_kernel =
        register_sharded(*this, "kv_kernel", kernel({hidden, 2, g * d}), o.kv_kernel_axes());
    q_fp8 = register_fp8_gemm(*this, "q_");
    kv_fp8 = register_fp8_gemm(*this, "kv_");
    if (qkv_bias_on) {
      q_bias =
          register_sharded(*this, "q_bias", at::zeros({heads * d}), output_axes(o.q_kernel_axes()));
      kv_bias = register_sharded(*this, "kv_bias", at::zeros({2, g * d}),
                                 output_axes(o.kv_kernel_axes()));
    }
  }
  out_kernel =
      register_sharded(*this, "out_kernel", kernel({heads * d, hidden}), o.out_kernel_axes());
  out_fp8 = register_fp8_gemm(*this, "out_");
  if (o.use_bias()) {
    out_bias = register_sharded(*this, "out_bias", at::zeros({hidden}), axis::replicated_1d());
  }
}

void MultiHeadAttentionImpl::reset() {
  check_mha_options(options, kv_heads());
  const int64_t d = head_dim();
  const DotProductAttentionOptions& a = options.attention();
  // Resolved (and warned about) once here; the attention gets the resolved window.
  const F::MaskSpec spec =
      F::mask_spec(a.attn_mask_type(), a.window_size(), a.bottom_right_diagonal());
  const QkNormType qk_norm = options.qk_norm_type();
  if (qk_norm == QkNormType::kRMSNorm || qk_norm == QkNormType::kLayerNorm) {
    const bool whole = options.qk_norm_over_heads();
    const int64_t heads = a.num_attention_heads();
    auto norm = [&](int64_t size) {
      return LayerNorm(
          LayerNormOptions(size)
              .layernorm_type(qk_norm == QkNormType::kRMSNorm ? "rmsnorm" : "layernorm")
              .epsilon(options.qk_norm_eps())
              .zero_centered_gamma(options.qk_norm_zero_centered_gamma()));
    };
    q_norm = register_module("q_norm", norm(whole ? heads * d : d));
    k_norm = register_module("k_norm", norm(whole ? kv_heads() * d : d));
  }
  if (options.input_layernorm()) {
    TE_CHECK(options.layernorm().hidden_size() == options.hidden_size(),
             "MultiHeadAttention: the norm's hidden_size ", options.layernorm().hidden_size(),
             " differs from ", options.hidden_size());
    layernorm = register_module("layernorm", LayerNorm(options.layernorm()));
  }
  const double scale = a.scale_factor() != 0.0       ? a.scale_factor()
                       : options.scale_attn_logits() ? 1.0 / std::sqrt(double(d))
                                                     : 1.0;
  attention = register_module(
      "attention",
      DotProductAttention(DotProductAttentionOptions(a)
                              .head_dim(d)
                              .num_gqa_groups(kv_heads())
                              .window_size(WindowSize{spec.window_left, spec.window_right})
                              .scale_factor(scale)));
  register_projections();
}

void MultiHeadAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "te::nn::MultiHeadAttention(hidden_size=" << options.hidden_size()
         << ", heads=" << options.attention().num_attention_heads() << ", head_dim=" << head_dim();
  if (kv_heads() != options.attention().num_attention_heads()) {
    stream << ", gqa_groups=" << kv_heads();
  }
  stream << ", mask=" << options.attention().attn_mask_type() << ", "
         << (options.self_attention() ? "self" : "cross") << (qkv_fp8 ? ", fused_qkv" : "")
         << (options.enable_sequence_parallel() ? ", sequence_parallel" : "") << ")";
}

namespace {

// L2Normalization (TE's ops/basic/l2normalization.py at d0067d0da): x / sqrt(sum x^2 + eps) over
// the last dim, which the per-head constraint keeps whole.
at::Tensor l2_normalize(const at::Tensor& x, double eps) {
  const at::Tensor f = x.to(at::kFloat);  // in float32, as TE's kernel (and for CPU fp16)
  return (f * at::rsqrt(f.pow(2).sum(-1, /*keepdim=*/true) + eps)).to(x.scalar_type());
}
DTensor l2_normalize(const DTensor& x_in, double eps) {
  // A norm over the last dim: made whole there first (the per-head constraint keeps it whole
  // under rules; without them nothing else would).
  const int64_t last = x_in.dim() - 1;
  const DTensor x =
      replicated_where(x_in, [last](const Placement& p, std::size_t) { return is_shard(p, last); });
  return F::elementwise(x, [eps](const at::Tensor& t) { return l2_normalize(t, eps); });
}

// The query's and key's axes in attention: heads split, and the sequence under context
// parallelism.
LogicalAxes per_head_axes(const MultiHeadAttentionOptions& o) {
  return {axis::kBatch, o.attention().cp_comm_type() ? axis::kSeqlenCp : axis::kSeqlen,
          axis::kHeads, std::nullopt};
}

// TE's qk-norm on a query or key [batch, seqlen, heads, head_dim]; over all heads at once with
// qk_norm_over_heads (the norm gathers split heads; the constraint splits them again).
template <typename T>
T qk_normalized(const MultiHeadAttentionImpl& self, LayerNorm norm, const T& t) {
  const MultiHeadAttentionOptions& o = self.options;
  if (o.qk_norm_type() == QkNormType::kNone) return t;
  if (!norm) return l2_normalize(t, o.qk_norm_eps());
  if (!o.qk_norm_over_heads()) return norm->forward(t);
  const T normed = F::unflatten(norm->forward(F::flatten(t, 2)), 2, t.size(2), t.size(3));
  return with_sharding_constraint(normed, per_head_axes(o));
}

// OLMo's clip_qkv: clamp(t, -clip, clip).
at::Tensor clipped(const at::Tensor& t, double clip) { return t.clamp(-clip, clip); }
DTensor clipped(const DTensor& t, double clip) {
  return F::elementwise(t, [clip](const at::Tensor& x) { return clipped(x, clip); });
}

// The query, key and value [batch, seqlen, heads, head_dim] of a (normed) input: one fused
// projection (its kernel may be held in FP8), or the query's and the key/value's.
template <typename T>
std::tuple<T, T, T> project_qkv(MultiHeadAttentionImpl& self, const T& ln,
                                const detail::Memory<T>& memory) {
  const MultiHeadAttentionOptions& o = self.options;
  const int64_t heads = o.attention().num_attention_heads(), d = self.head_dim(),
                g = self.kv_heads();
  // The projections take whole sequences (sequence parallel's gather, folded into their
  // matmuls on a mesh, so its backward is a reduce-scatter).
  const LogicalAxes whole = {axis::kBatch, axis::kSeqlen, axis::kHidden};
  // Under context parallelism attention keeps the sequence split over seqlen_cp's mesh axis.
  const LogicalAxes per_head = per_head_axes(o);
  T q, k, v;
  if (self.qkv_fp8) {
    T qkv =
        detail::project(self, ln, "qkv_", self.qkv_kernel, self.qkv_bias, self.qkv_fp8, whole, {});
    qkv = with_sharding_constraint(
        F::unflatten(qkv, 3, heads, d),
        {axis::kBatch, axis::kSeqlen, axis::kJoined, axis::kHeads, std::nullopt});
    q = F::select(qkv, 2, 0);
    k = F::select(qkv, 2, 1);
    v = F::select(qkv, 2, 2);
  } else {
    const T& src = o.self_attention() ? ln : detail::get(memory);
    q = F::unflatten(
        detail::project(self, ln, "q_", self.q_kernel, self.q_bias, self.q_fp8, whole, {}), 2,
        heads, d);
    const T kv = F::unflatten(
        detail::project(self, src, "kv_", self.kv_kernel, self.kv_bias, self.kv_fp8, whole, {}), 3,
        g, d);
    k = F::select(kv, 2, 0);
    v = F::select(kv, 2, 1);
  }
  return {with_sharding_constraint(q, per_head), with_sharding_constraint(k, per_head),
          with_sharding_constraint(v, per_head)};
}

// With a KV cache the step's tokens are packed sequences: [batch, s] becomes a batch of one.
void check_cache_step(const MultiHeadAttentionOptions& o, const InferenceParams& cache,
                      int64_t batch, int64_t seqlen, const std::string& shape) {
  TE_CHECK(o.self_attention(),
           "MultiHeadAttention: a KV cache is for self attention; this one is cross attention");
  TE_CHECK(o.attention().qkv_format() != QkvFormat::kThd,
           "MultiHeadAttention: a KV cache takes bshd input (its own packing)");
  TE_CHECK(batch * seqlen == cache.new_tokens() &&
               (batch == 1 || (batch == cache.batch_size() &&
                               cache.max_seqlen_q() * batch == cache.new_tokens())),
           "MultiHeadAttention: input ", shape, " does not hold the KV cache step's ",
           cache.new_tokens(), " new tokens of ", cache.batch_size(), " sequences: give [1, ",
           cache.new_tokens(),
           ", hidden] (packed in pre_step's order), or [batch, s, hidden] when every sequence "
           "brings s");
}

// qkv_format thd with 2-D cu_seqlens: x is rows of packed sequences [rows, tokens, hidden].
bool packed_rows(const MultiHeadAttentionOptions& o, const AttentionArgs& args) {
  return o.attention().qkv_format() == QkvFormat::kThd && args.cu_seqlens_q().defined() &&
         args.cu_seqlens_q().dim() == 2;
}

// RoPE on the query and key (multi_head_attention.py L1150-1192 at d0067d0da); clears the
// embedding from the args the attention gets.
template <typename T>
void rotate_qk(const MultiHeadAttentionOptions& o, const InferenceParams* cache, T& q, T& k,
               AttentionArgs& args) {
  if (!args.rotary_pos_emb().defined()) {
    TE_CHECK(args.rotary_attention_factor() == 1.0, "MultiHeadAttention: rotary_attention_factor ",
             args.rotary_attention_factor(), " without rotary_pos_emb; give the frequencies too");
    return;
  }
  const at::Tensor freqs = args.rotary_pos_emb();
  const double factor = args.rotary_attention_factor();
  const bool packed = o.attention().qkv_format() == QkvFormat::kThd;
  const bool cp = o.attention().cp_comm_type().has_value();
  // Rows, or under context parallelism a batch of one as a row (its tokens TE's layout).
  if (packed_rows(o, args) || (packed && cp && !cache)) {
    auto rotate = [&](const T& t, const at::Tensor& cu_in, const at::Tensor& padded_in,
                      const char* name) {
      const bool row = cu_in.defined() && cu_in.dim() == 1;
      const at::Tensor cu = row ? cu_in.unsqueeze(0) : cu_in;
      const at::Tensor padded = row && padded_in.defined() ? padded_in.unsqueeze(0) : padded_in;
      // Positions restart at each sequence of each row (the tokens' global ones under cp).
      return detail::on_packed_rows(
          t,
          [&](const at::Tensor& rows, int64_t offset, int64_t cp_size, int64_t cp_rank) {
            const F::PackedRows p = F::packed_rows(cu, padded, rows.size(1) * cp_size, offset,
                                                   rows.size(0), "MultiHeadAttention", name);
            return F::apply_rotary_pos_emb(rows.flatten(0, 1), freqs, "thd",
                                           o.rotary_pos_interleaved(), p.cu_seqlens_padded, {},
                                           factor, cp_size, cp_rank)
                .reshape(rows.sizes());
          },
          cp);
    };
    q = rotate(q, args.cu_seqlens_q(), args.cu_seqlens_q_padded(), "cu_seqlens_q");
    k = rotate(k, args.cu_seqlens_kv(), args.cu_seqlens_kv_padded(), "cu_seqlens_kv");
  } else if (o.attention().qkv_format() == QkvFormat::kThd || cache) {
    // Positions restart at each sequence's (padded) start (L1156-1181), or with a cache go on
    // from each sequence's cached length (L1152-1153).
    const at::Tensor& cu_q = cache                                  ? cache->cu_seqlens_q()
                             : args.cu_seqlens_q_padded().defined() ? args.cu_seqlens_q_padded()
                                                                    : args.cu_seqlens_q();
    const at::Tensor& cu_kv = cache                                   ? cache->cu_seqlens_q()
                              : args.cu_seqlens_kv_padded().defined() ? args.cu_seqlens_kv_padded()
                                                                      : args.cu_seqlens_kv();
    const at::Tensor start = cache ? cache->pre_step_seqlens() : at::Tensor();
    TE_CHECK(cu_q.defined() && cu_kv.defined(),
             "MultiHeadAttention: qkv_format 'thd' needs AttentionArgs' cu_seqlens_q and "
             "cu_seqlens_kv");
    q = detail::batch_of_one(F::apply_rotary_pos_emb(
        detail::tokens_only(q), freqs, "thd", o.rotary_pos_interleaved(), cu_q, start, factor));
    k = detail::batch_of_one(F::apply_rotary_pos_emb(
        detail::tokens_only(k), freqs, "thd", o.rotary_pos_interleaved(), cu_kv, start, factor));
  } else if (cp && o.attention().cp_load_balanced()) {
    // Each rank's tokens (its chunks r and 2·cp-1-r) by their own positions.
    auto rotate = [&](const T& t) {
      return detail::on_packed_rows(
          t,
          [&](const at::Tensor& rows, int64_t, int64_t cp_size, int64_t cp_rank) {
            return F::apply_rotary_pos_emb(rows, freqs, "bshd", o.rotary_pos_interleaved(), {}, {},
                                           factor, cp_size, cp_rank);
          },
          true);
    };
    q = rotate(q);
    k = rotate(k);
  } else {
    q = F::apply_rotary_pos_emb(q, freqs, "bshd", o.rotary_pos_interleaved(), {}, {}, factor);
    k = F::apply_rotary_pos_emb(k, freqs, "bshd", o.rotary_pos_interleaved(), {}, {}, factor);
  }
  args.rotary_pos_emb(at::Tensor());
  args.rotary_attention_factor(1.0);
}

// MultiHeadAttention's one forward (modules/src/forward.h): the output and the input norm's.
template <typename T>
std::pair<T, T> mha_forward(MultiHeadAttentionImpl& self, const T& x_in,
                            const detail::Memory<T>& memory, const at::Tensor& mask,
                            const AttentionArgs& args) {
  detail::enter(self, "MultiHeadAttention", x_in);
  const MultiHeadAttentionOptions& o = self.options;
  const bool packed = o.attention().qkv_format() == QkvFormat::kThd;
  const bool rows = packed_rows(o, args);
  const bool cp = o.attention().cp_comm_type().has_value();
  if (packed && x_in.dim() == 2) {  // [tokens, hidden]: run as a batch of one
    const auto [y, ln] = mha_forward(self, detail::batch_of_one(x_in, cp), memory, mask, args);
    return {detail::tokens_only(y, cp), detail::tokens_only(ln, cp)};
  }
  TE_CHECK(
      x_in.dim() == 3 && x_in.size(2) == o.hidden_size() && (!packed || rows || x_in.size(0) == 1),
      "MultiHeadAttention: input ", detail::shape_of(x_in), " is not ",
      packed ? "[tokens, " : "[batch, seqlen, ", o.hidden_size(), "]",
      packed ? " (or [1, tokens, hidden]) for qkv_format 'thd'; rows of packed sequences "
               "[rows, tokens, hidden] take 2-D cu_seqlens [rows, sequences + 1]"
             : "");
  TE_CHECK(!rows || args.cu_seqlens_q().size(0) == x_in.size(0),
           "MultiHeadAttention: ", args.cu_seqlens_q().size(0), " rows of cu_seqlens_q for input ",
           detail::shape_of(x_in), ": give one row [sequences + 1] for each input row");
  TE_CHECK(o.self_attention() != detail::has(memory), "MultiHeadAttention: ",
           o.self_attention() ? "self attention takes no memory; build it with "
                                "self_attention(false) for cross attention"
                              : "cross attention needs the memory to attend to");
  const LogicalAxes act = {axis::kBatch, axis::seqlen(o.enable_sequence_parallel()), axis::kHidden};
  const T x = with_sharding_constraint(x_in, act);
  const T ln = o.input_layernorm() ? self.layernorm->forward(x) : x;
  auto [q, k, v] = project_qkv(self, ln, memory);
  InferenceParams* const cache = args.inference_params();
  const int64_t batch = x.size(0), seqlen = x.size(1);
  if (cache) {
    check_cache_step(o, *cache, batch, seqlen, detail::shape_of(x));
    TE_CHECK(!mask.defined(),
             "MultiHeadAttention: a KV cache takes no mask (the cache says "
             "which keys each sequence has)");
    if (batch != 1) {
      q = F::unflatten(F::flatten(q, 0), 0, 1, batch * seqlen);
      k = F::unflatten(F::flatten(k, 0), 0, 1, batch * seqlen);
      v = F::unflatten(F::flatten(v, 0), 0, 1, batch * seqlen);
    }
  }
  // qk-norm before or after RoPE, RoPE after the projections, then attention
  // (multi_head_attention.py L1130-1192 at d0067d0da); the attention takes the rest of the args.
  if (o.qk_norm_before_rope()) {
    q = qk_normalized(self, self.q_norm, q);
    k = qk_normalized(self, self.k_norm, k);
  }
  if (o.clip_qkv() > 0) {
    q = clipped(q, o.clip_qkv());
    k = clipped(k, o.clip_qkv());
    v = clipped(v, o.clip_qkv());
  }
  AttentionArgs attention_args = args;
  rotate_qk(o, cache, q, k, attention_args);
  if (!o.qk_norm_before_rope()) {
    q = qk_normalized(self, self.q_norm, q);
    k = qk_normalized(self, self.k_norm, k);
  }
  T attended;
  if (cache) {
    attended = detail::cached_attention(*self.attention, q, k, v, attention_args);
    if (batch != 1) attended = F::unflatten(F::flatten(attended, 0), 0, batch, seqlen);
  } else if (packed && !rows) {
    attended = detail::batch_of_one(
        self.attention->forward(detail::tokens_only(q, cp), detail::tokens_only(k, cp),
                                detail::tokens_only(v, cp), mask, attention_args),
        cp);
  } else {
    attended = self.attention->forward(q, k, v, mask, attention_args);
  }
  const T out = F::flatten(attended, 2);
  // Tensor parallel: the output constraint is the all-reduce (or reduce-scatter).
  return {detail::project(self, out, "out_", self.out_kernel, self.out_bias, self.out_fp8,
                          {axis::kBatch, axis::kSeqlen, axis::kHiddenTp}, act),
          ln};
}

}  // namespace

at::Tensor MultiHeadAttentionImpl::forward(const at::Tensor& x, const at::Tensor& memory,
                                           const at::Tensor& mask, const AttentionArgs& args) {
  return mha_forward(*this, x, memory, mask, args).first;
}

std::pair<at::Tensor, at::Tensor> MultiHeadAttentionImpl::forward_with_layernorm_output(
    const at::Tensor& x, const at::Tensor& memory, const at::Tensor& mask,
    const AttentionArgs& args) {
  return mha_forward(*this, x, memory, mask, args);
}

std::pair<DTensor, DTensor> MultiHeadAttentionImpl::forward_with_layernorm_output(
    const DTensor& x, const std::optional<DTensor>& memory, const at::Tensor& mask,
    const AttentionArgs& args) {
  return mha_forward(*this, x, memory, mask, args);
}

DTensor MultiHeadAttentionImpl::forward(const DTensor& x, const std::optional<DTensor>& memory,
                                        const at::Tensor& mask, const AttentionArgs& args) {
  return mha_forward(*this, x, memory, mask, args).first;
}

std::vector<ShardedModule::Fp8Gemm> MultiHeadAttentionImpl::fp8_gemms() {
  std::vector<Fp8Gemm> out;
  if (qkv_fp8) out.push_back({"qkv_kernel", qkv_kernel, qkv_fp8});
  if (q_fp8) out.push_back({"q_kernel", q_kernel, q_fp8});
  if (kv_fp8) out.push_back({"kv_kernel", kv_kernel, kv_fp8});
  out.push_back({"out_kernel", out_kernel, out_fp8});
  return out;
}

void MultiHeadAttentionImpl::forget_member(const std::string& name) {
  for (auto [kernel_name, member] : {std::pair{"qkv_kernel", &qkv_kernel},
                                     {"q_kernel", &q_kernel},
                                     {"kv_kernel", &kv_kernel},
                                     {"out_kernel", &out_kernel}}) {
    if (name == kernel_name) {
      *member = at::Tensor();
      return;
    }
  }
  ShardedModule::forget_member(name);
}

}  // namespace te::nn
