#include "te/nn/attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>

#include "constrain.h"
#include "te/compat.h"
#include "te/error.h"
#include "te/fp8.h"
#include "te/nn/functional.h"
#include "te/nn/init.h"

namespace te::nn {

namespace F = functional;

namespace {

// The mask as given, or undefined when the mask type ignores it (functional::attention checks
// it: functional::check_attention_mask).
at::Tensor effective_mask(const F::MaskSpec& spec, const at::Tensor& mask) {
  return spec.takes_mask() ? mask : at::Tensor();
}

bool fused_available(bool wanted) {
#if TE_HAS_SDPA
  return wanted;
#else
  (void)wanted;
  return false;
#endif
}

}  // namespace

// ---- DotProductAttention ---------------------------------------------------------------------

DotProductAttentionImpl::DotProductAttentionImpl(const DotProductAttentionOptions& options_)
    : options(options_) {
  reset();
}

void DotProductAttentionImpl::reset() {
  TE_CHECK(options.num_attention_heads() > 0 && options.head_dim() > 0,
           "DotProductAttention: num_attention_heads (", options.num_attention_heads(),
           ") and head_dim (", options.head_dim(), ") must be positive");
  const int64_t groups =
      options.num_gqa_groups() == 0 ? options.num_attention_heads() : options.num_gqa_groups();
  TE_CHECK(groups > 0 && options.num_attention_heads() % groups == 0,
           "DotProductAttention: ", options.num_attention_heads(),
           " heads are not a multiple of num_gqa_groups ", groups);
  mask_spec = F::mask_spec(options.attn_mask_type(), options.window_size(),
                           options.bottom_right_diagonal());
  TE_CHECK(options.attention_dropout() >= 0 && options.attention_dropout() < 1,
           "DotProductAttention: attention_dropout ", options.attention_dropout(),
           " is not in [0, 1)");
}

void DotProductAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "te::nn::DotProductAttention(heads=" << options.num_attention_heads()
         << ", head_dim=" << options.head_dim();
  if (options.num_gqa_groups() != 0) stream << ", gqa_groups=" << options.num_gqa_groups();
  stream << ", mask=" << options.attn_mask_type();
  if (mask_spec.window_left >= 0 || (!mask_spec.causal() && mask_spec.window_right >= 0)) {
    stream << ", window=(" << mask_spec.window_left << ", " << mask_spec.window_right << ")";
  }
  stream << ", dropout=" << options.attention_dropout() << ")";
}

namespace {
double logit_scale(const DotProductAttentionOptions& options) {
  return options.scale_factor() != 0.0 ? options.scale_factor()
                                       : 1.0 / std::sqrt(static_cast<double>(options.head_dim()));
}
}  // namespace

std::string DotProductAttentionImpl::fused_backend(const at::Tensor& query, const at::Tensor& key,
                                                   const at::Tensor& value,
                                                   const at::Tensor& mask) const {
  return F::attention_plan(query, key, value, effective_mask(mask_spec, mask), mask_spec,
                           logit_scale(options), options.attention_dropout(), is_training(),
                           fused_available(options.fused()))
      .backend;
}

at::Tensor DotProductAttentionImpl::forward(const at::Tensor& query, const at::Tensor& key,
                                            const at::Tensor& value, const at::Tensor& mask) {
  const double scale = logit_scale(options);
  const bool fused = fused_available(options.fused());
  return F::attention(
      query, key, value, effective_mask(mask_spec, mask), mask_spec, scale,
      options.attention_dropout(), is_training(), fused,
      fused ? std::function<at::Tensor(const at::Tensor&)>() : [](const at::Tensor& logits) {
        // Validates the constraint on one device (never a repeated
        // name: the seed's seqlen, seqlen bug).
        return with_sharding_constraint(logits, {"batch", "heads", std::nullopt, std::nullopt});
      });
}

DTensor DotProductAttentionImpl::forward(const DTensor& query, const DTensor& key,
                                         const DTensor& value, const at::Tensor& mask) {
  // Attention is local to each (batch, head): whole sequences and head dims, batch and heads
  // sharded alike on q, k and v.
  auto whole = [](const DTensor& t) {
    std::vector<Placement> target = t.placements();
    bool change = false;
    for (Placement& p : target) {
      if (is_partial(p) || is_shard(p, 1) || is_shard(p, 3)) {
        p = Replicate{};
        change = true;
      }
    }
    return change ? t.redistribute(target) : t;
  };
  const DTensor q = whole(query);
  // Heads split over mesh axes must split whole query and key/value heads (GQA groups), the
  // same on every rank; checked before any collective so every rank stops here alike.
  int64_t head_ranks = 1;
  std::string head_axes;
  for (int64_t m = 0; m < q.mesh().ndim(); ++m) {
    if (is_shard(q.placements()[static_cast<std::size_t>(m)], 2)) {
      head_ranks *= q.mesh().size(m);
      head_axes += (head_axes.empty() ? "'" : ", '") +
                   q.mesh().axis_names()[static_cast<std::size_t>(m)] + "'";
    }
  }
  TE_CHECK(q.size(2) % head_ranks == 0 && key.size(2) % head_ranks == 0,
           "DotProductAttention: ", q.size(2), " query heads and ", key.size(2),
           " key/value heads (num_gqa_groups) cannot be split evenly over the ", head_ranks,
           " ranks of mesh axes ", head_axes,
           " that shard the heads; use head counts that are "
           "multiples of ",
           head_ranks, " or shard the heads over fewer ranks");
  const DTensor k = whole(key).redistribute(q.placements());
  const DTensor v = whole(value).redistribute(q.placements());
  // Where this rank's [batch, seqlen, heads, head_dim] piece sits: its batch rows of the mask,
  // and its slice of the probabilities' dropout mask.
  const auto piece = local_chunks(q.sizes(), q.mesh(), q.placements(), q.mesh().rank());
  at::Tensor local_mask = effective_mask(mask_spec, mask);
  // The global mask, checked before any rank narrows it to its batch rows and heads.
  F::check_attention_mask(local_mask, mask_spec, q.size(0), q.size(2), q.size(1), k.size(1));
  if (local_mask.defined()) {
    if (local_mask.size(0) > 1) local_mask = local_mask.narrow(0, piece[0].offset, piece[0].length);
    if (local_mask.size(1) > 1) local_mask = local_mask.narrow(1, piece[2].offset, piece[2].length);
  }
  const double scale = logit_scale(options);
  const bool fused = fused_available(options.fused());
  std::function<at::Tensor(const at::Tensor&)> on_logits;
  if (!fused) {
    // The attention weights [batch, heads, sq, sk] carry q's batch and head shards.
    std::vector<Placement> weights = q.placements();
    for (Placement& p : weights) {
      if (is_shard(p, 2)) p = Shard{1};
    }
    const std::vector<int64_t> shape = {q.size(0), q.size(2), q.size(1), k.size(1)};
    const DeviceMesh mesh = q.mesh();
    on_logits = [weights, shape, mesh](const at::Tensor& logits) {
      return with_sharding_constraint(DTensor::from_local(logits, mesh, weights, shape),
                                      {"batch", "heads", std::nullopt, std::nullopt})
          .redistribute(weights)
          .to_local();
    };
  }
  at::Tensor out = F::attention(q.to_local(), k.to_local(), v.to_local(), local_mask, mask_spec,
                                scale, options.attention_dropout(), is_training(), fused, on_logits,
                                q.size(0), piece[0].offset, q.size(2), piece[2].offset);
  return DTensor::from_local(out, q.mesh(), q.placements(), q.sizes());
}

// ---- MultiHeadAttention ----------------------------------------------------------------------

MultiHeadAttentionImpl::MultiHeadAttentionImpl(const MultiHeadAttentionOptions& options_)
    : options(options_) {
  reset();
}

int64_t MultiHeadAttentionImpl::head_dim() const {
  return options.head_dim() != 0 ? options.head_dim()
                                 : options.hidden_size() / options.num_attention_heads();
}

int64_t MultiHeadAttentionImpl::kv_heads() const {
  return options.num_gqa_groups() != 0 ? options.num_gqa_groups() : options.num_attention_heads();
}

void MultiHeadAttentionImpl::reset() {
  const int64_t hidden = options.hidden_size(), heads = options.num_attention_heads();
  TE_CHECK(hidden > 0 && heads > 0, "MultiHeadAttention: hidden_size (", hidden,
           ") and num_attention_heads (", heads, ") must be positive");
  TE_CHECK(options.head_dim() != 0 || hidden % heads == 0, "MultiHeadAttention: hidden_size ",
           hidden, " is not a multiple of num_attention_heads ", heads,
           "; set head_dim explicitly");
  const int64_t d = head_dim(), g = kv_heads();
  TE_CHECK(g > 0 && heads % g == 0, "MultiHeadAttention: ", heads,
           " heads are not a multiple of num_gqa_groups ", g);
  // Resolved (and warned about) once here; the attention gets the resolved window.
  const F::MaskSpec spec = F::mask_spec(options.attn_mask_type(), options.window_size(),
                                        options.bottom_right_diagonal());
  if (options.input_layernorm()) {
    TE_CHECK(options.layernorm().hidden_size() == hidden,
             "MultiHeadAttention: the norm's "
             "hidden_size ",
             options.layernorm().hidden_size(), " differs from ", hidden);
    layernorm = register_module("layernorm", LayerNorm(options.layernorm()));
  }
  attention = register_module(
      "attention",
      DotProductAttention(
          DotProductAttentionOptions(heads, d)
              .num_gqa_groups(g)
              .attn_mask_type(options.attn_mask_type())
              .window_size(WindowSize{spec.window_left, spec.window_right})
              .bottom_right_diagonal(options.bottom_right_diagonal())
              .attention_dropout(options.attention_dropout())
              .scale_factor(options.scale_attn_logits() ? 1.0 / std::sqrt(double(d)) : 1.0)
              .fused(options.fused_attention())));
  // TE's attention kernels: variance_scaling(1, fan_in, normal); the query part divided by
  // sqrt(head_dim) when scaled_query_init (then the logits are not scaled).
  const double query_scale = options.scaled_query_init() ? 1.0 / std::sqrt(double(d)) : 1.0;
  auto kernel = [&](std::vector<int64_t> shape) {
    return variance_scaling(shape, 1, 1.0, "fan_in", "normal");
  };
  // A bias takes its kernel's output axes (all but the first).
  auto output_axes = [](const LogicalAxes& kernel_axes) {
    return LogicalAxes(kernel_axes.begin() + 1, kernel_axes.end());
  };
  if (options.self_attention() && options.fuse_qkv() && g == heads) {
    at::Tensor w = kernel({hidden, 3, heads * d});
    w.select(1, 0).mul_(query_scale);
    qkv_kernel = register_sharded(*this, "qkv_kernel", w, options.qkv_kernel_axes());
    qkv_fp8 = fp8::GemmMeta::registered(*this, "qkv_");
    if (options.use_bias()) {
      qkv_bias = register_sharded(*this, "qkv_bias", at::zeros({3, heads * d}),
                                  output_axes(options.qkv_kernel_axes()));
    }
  } else {
    q_kernel = register_sharded(*this, "q_kernel", kernel({hidden, heads * d}) * query_scale,
                                options.q_kernel_axes());
    kv_kernel =
        register_sharded(*this, "kv_kernel", kernel({hidden, 2, g * d}), options.kv_kernel_axes());
    q_fp8 = fp8::GemmMeta::registered(*this, "q_");
    kv_fp8 = fp8::GemmMeta::registered(*this, "kv_");
    if (options.use_bias()) {
      q_bias = register_sharded(*this, "q_bias", at::zeros({heads * d}),
                                output_axes(options.q_kernel_axes()));
      kv_bias = register_sharded(*this, "kv_bias", at::zeros({2, g * d}),
                                 output_axes(options.kv_kernel_axes()));
    }
  }
  out_kernel =
      register_sharded(*this, "out_kernel", kernel({heads * d, hidden}), options.out_kernel_axes());
  out_fp8 = fp8::GemmMeta::registered(*this, "out_");
  if (options.use_bias()) {
    out_bias = register_sharded(*this, "out_bias", at::zeros({hidden}), axis::replicated_1d());
  }
}

void MultiHeadAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "te::nn::MultiHeadAttention(hidden_size=" << options.hidden_size()
         << ", heads=" << options.num_attention_heads() << ", head_dim=" << head_dim();
  if (kv_heads() != options.num_attention_heads()) stream << ", gqa_groups=" << kv_heads();
  stream << ", mask=" << options.attn_mask_type() << ", "
         << (options.self_attention() ? "self" : "cross") << (qkv_fp8 ? ", fused_qkv" : "")
         << (options.enable_sequence_parallel() ? ", sequence_parallel" : "") << ")";
}

at::Tensor MultiHeadAttentionImpl::forward(const at::Tensor& x, const at::Tensor& memory,
                                           const at::Tensor& mask) {
  require_unsharded(*this, "MultiHeadAttention");
  TE_CHECK(x.dim() == 3 && x.size(2) == options.hidden_size(), "MultiHeadAttention: input ",
           x.sizes(), " is not [batch, seqlen, ", options.hidden_size(), "]");
  TE_CHECK(options.self_attention() != memory.defined(), "MultiHeadAttention: ",
           options.self_attention() ? "self attention takes no memory; build it with "
                                      "self_attention(false) for cross attention"
                                    : "cross attention needs the memory to attend to");
  const int64_t b = x.size(0), s = x.size(1), heads = options.num_attention_heads();
  const int64_t d = head_dim(), g = kv_heads();
  const at::Tensor ln = options.input_layernorm() ? layernorm->forward(x) : x;
  at::Tensor q, k, v;
  if (qkv_fp8) {  // fused (its kernel may be held in FP8)
    const at::Tensor qkv =
        F::dense(ln, qkv_kernel, qkv_fp8, nullptr, qkv_bias).view({b, s, 3, heads, d});
    q = qkv.select(2, 0);
    k = qkv.select(2, 1);
    v = qkv.select(2, 2);
  } else {
    const at::Tensor& src = options.self_attention() ? ln : memory;
    q = F::dense(ln, q_kernel, q_fp8, nullptr, q_bias).view({b, s, heads, d});
    const at::Tensor kv =
        F::dense(src, kv_kernel, kv_fp8, nullptr, kv_bias).view({b, src.size(1), 2, g, d});
    k = kv.select(2, 0);
    v = kv.select(2, 1);
  }
  at::Tensor out = attention->forward(q, k, v, mask).reshape({b, s, heads * d});
  return F::dense(out, out_kernel, out_fp8, nullptr, out_bias);
}

DTensor MultiHeadAttentionImpl::forward(const DTensor& x_in, const std::optional<DTensor>& memory,
                                        const at::Tensor& mask) {
  TE_CHECK(x_in.dim() == 3 && x_in.size(2) == options.hidden_size(), "MultiHeadAttention: input ",
           x_in.to_string(), " is not [batch, seqlen, ", options.hidden_size(), "]");
  TE_CHECK(options.self_attention() != memory.has_value(), "MultiHeadAttention: ",
           options.self_attention() ? "self attention takes no memory; build it with "
                                      "self_attention(false) for cross attention"
                                    : "cross attention needs the memory to attend to");
  const DeviceMesh& mesh = x_in.mesh();
  const char* seq = axis::seqlen(options.enable_sequence_parallel());
  const int64_t heads = options.num_attention_heads(), d = head_dim(), g = kv_heads();
  const LogicalAxes act = {"batch", seq, "hidden"};
  const LogicalAxes whole = {"batch", "seqlen", "hidden"};
  const LogicalAxes per_head = {"batch", "seqlen", "heads", std::nullopt};

  const DTensor x = with_sharding_constraint(x_in, act);
  // The projections' input constraint (whole sequences: sequence parallel's gather) is folded
  // into their matmuls, so its backward is a reduce-scatter.
  const DTensor ln = options.input_layernorm() ? layernorm->forward(x) : x;
  DTensor q, k, v;
  if (qkv_fp8) {
    DTensor qkv = F::dense(ln, as_dtensor("qkv_kernel", qkv_kernel, mesh), whole, qkv_fp8);
    if (qkv_bias.defined()) qkv = F::add_bias(qkv, as_dtensor("qkv_bias", qkv_bias, mesh));
    qkv = F::unflatten(qkv, 3, heads, d);
    qkv = with_sharding_constraint(qkv, {"batch", "seqlen", "joined", "heads", std::nullopt});
    q = F::select(qkv, 2, 0);
    k = F::select(qkv, 2, 1);
    v = F::select(qkv, 2, 2);
  } else {
    const DTensor& src = options.self_attention() ? ln : *memory;
    DTensor qp = F::dense(ln, as_dtensor("q_kernel", q_kernel, mesh), whole, q_fp8);
    if (q_bias.defined()) qp = F::add_bias(qp, as_dtensor("q_bias", q_bias, mesh));
    q = F::unflatten(qp, 2, heads, d);
    DTensor kv = F::dense(src, as_dtensor("kv_kernel", kv_kernel, mesh), whole, kv_fp8);
    if (kv_bias.defined()) kv = F::add_bias(kv, as_dtensor("kv_bias", kv_bias, mesh));
    kv = F::unflatten(kv, 3, g, d);
    k = F::select(kv, 2, 0);
    v = F::select(kv, 2, 1);
  }
  q = with_sharding_constraint(q, per_head);
  k = with_sharding_constraint(k, per_head);
  v = with_sharding_constraint(v, per_head);
  const DTensor out = F::flatten(attention->forward(q, k, v, mask), 2);
  DTensor y = F::dense(out, as_dtensor("out_kernel", out_kernel, mesh),
                       {"batch", "seqlen", "hidden_tp"}, out_fp8);
  y = with_sharding_constraint(y, act);  // tensor parallel: the all-reduce (or reduce-scatter)
  if (out_bias.defined()) y = F::add_bias(y, as_dtensor("out_bias", out_bias, mesh));
  return y;
}

std::vector<ShardedModule::Fp8Gemm> MultiHeadAttentionImpl::fp8_gemms() {
  std::vector<Fp8Gemm> out;
  if (qkv_fp8) out.push_back({"qkv_kernel", &qkv_kernel, qkv_fp8});
  if (q_fp8) out.push_back({"q_kernel", &q_kernel, q_fp8});
  if (kv_fp8) out.push_back({"kv_kernel", &kv_kernel, kv_fp8});
  out.push_back({"out_kernel", &out_kernel, out_fp8});
  return out;
}

}  // namespace te::nn
