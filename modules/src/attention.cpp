#include "te/nn/attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>

#include "constrain.h"
#include "forward.h"
#include "te/compat.h"
#include "te/error.h"
#include "te/fp8.h"
#include "te/nn/functional.h"
#include "te/nn/init.h"

namespace te::nn {

namespace F = functional;

namespace detail {

namespace {
// `dim` of t holds the packed tokens, or (tokens_only's dim 0) the batch of one they are in.
void check_whole_tokens(const DTensor& t, int64_t dim) {
  for (std::size_t m = 0; m < t.placements().size(); ++m) {
    TE_CHECK(!is_shard(t.placements()[m], dim), "qkv_format 'thd': the packed tokens ",
             t.to_string(), " are split over mesh axis '", t.mesh().axis_names()[m], "' (dim ", dim,
             ": each sequence needs all its keys on one rank): replicate the tokens and shard "
             "the heads, or give each rank its own packed batch (rules that shard 'batch' or "
             "'seqlen' there split them)");
  }
}
std::vector<Placement> shifted(std::vector<Placement> p, int64_t by) {
  for (Placement& x : p) {
    if (is_shard(x)) x = Shard{std::get<Shard>(x).dim + by};
  }
  return p;
}
}  // namespace

DTensor batch_of_one(const DTensor& t) {
  check_whole_tokens(t, 0);
  std::vector<int64_t> shape = t.sizes();
  shape.insert(shape.begin(), 1);
  return DTensor::from_local(t.to_local().unsqueeze(0), t.mesh(), shifted(t.placements(), 1),
                             shape);
}

DTensor tokens_only(const DTensor& t) {
  check_whole_tokens(t, 0);
  check_whole_tokens(t, 1);
  std::vector<int64_t> shape = t.sizes();
  shape.erase(shape.begin());
  return DTensor::from_local(t.to_local().squeeze(0), t.mesh(), shifted(t.placements(), -1), shape);
}

}  // namespace detail

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
  TE_CHECK(options.num_attention_heads() > 0 && options.head_dim() > 0 && options.head_dim_v() >= 0,
           "DotProductAttention: num_attention_heads (", options.num_attention_heads(),
           ") and head_dim (", options.head_dim(), ") must be positive, head_dim_v (",
           options.head_dim_v(), ") positive or 0 (head_dim)");
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
  F::check_softmax_type(options.softmax_type());
  const std::string& format = options.qkv_format();
  TE_CHECK(format == "bshd" || format == "sbhd" || format == "thd",
           "DotProductAttention: qkv_format '", format, "' is not 'bshd', 'sbhd' or 'thd'");
  TE_CHECK(format != "thd" || mask_spec.padding(),
           "DotProductAttention: qkv_format 'thd' needs a padding attn_mask_type (padding, "
           "padding_causal or padding_causal_bottom_right), as TE's; got '",
           options.attn_mask_type(), "'");
  // TE's softmax_offset (dot_product_attention.py L772-783 at d0067d0da): zeros, one per head,
  // a parameter for "learnable" ("off-by-one" adds a constant zero, no parameter).
  if (options.softmax_type() == "learnable") {
    softmax_offset = register_sharded(*this, "softmax_offset",
                                      at::zeros({options.num_attention_heads()}), {"heads"});
  }
}

void DotProductAttentionImpl::pretty_print(std::ostream& stream) const {
  stream << "te::nn::DotProductAttention(heads=" << options.num_attention_heads()
         << ", head_dim=" << options.head_dim();
  if (options.head_dim_v() != 0 && options.head_dim_v() != options.head_dim()) {
    stream << ", head_dim_v=" << options.head_dim_v();
  }
  if (options.num_gqa_groups() != 0) stream << ", gqa_groups=" << options.num_gqa_groups();
  stream << ", mask=" << options.attn_mask_type();
  if (mask_spec.window_left >= 0 || (!mask_spec.causal() && mask_spec.window_right >= 0)) {
    stream << ", window=(" << mask_spec.window_left << ", " << mask_spec.window_right << ")";
  }
  if (options.softmax_type() != "vanilla") stream << ", softmax=" << options.softmax_type();
  stream << ", dropout=" << options.attention_dropout() << ")";
}

namespace {
double logit_scale(const DotProductAttentionOptions& options) {
  return options.scale_factor() != 0.0 ? options.scale_factor()
                                       : 1.0 / std::sqrt(static_cast<double>(options.head_dim()));
}
}  // namespace

namespace {

// Where attention runs: q, k, v in the layout attention computes in, and this process's piece of
// the global [batch, seqlen, heads, head_dim] (its batch rows and heads). On one device that is
// everything.
template <typename T>
struct Arranged {
  T q, k, v;
  int64_t batch_offset = 0, head_offset = 0;
};

Arranged<at::Tensor> arrange(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return {q, k, v};
}

// On a mesh attention is local to each (batch, head): whole sequences and head dims, batch and
// heads sharded alike on q, k and v.
Arranged<DTensor> arrange(const DTensor& query, const DTensor& key, const DTensor& value) {
  auto whole = [](const DTensor& t) {
    return replicated_where(t, [](const Placement& p, std::size_t) {
      return is_partial(p) || is_shard(p, 1) || is_shard(p, 3);
    });
  };
  const DTensor q = whole(query);
  // Heads split over mesh axes must split whole query and key/value heads (GQA groups), the
  // same on every rank; checked before any collective so every rank stops here alike.
  const int64_t head_ranks = shard_parts(q, 2);
  std::string head_axes;
  for (int64_t m = 0; m < q.mesh().ndim(); ++m) {
    if (is_shard(q.placements()[static_cast<std::size_t>(m)], 2)) {
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
  const auto piece = local_chunks(q.sizes(), q.mesh(), q.placements(), q.mesh().rank());
  return {q, whole(key).redistribute(q.placements()), whole(value).redistribute(q.placements()),
          piece[0].offset, piece[2].offset};
}

// q, k, v in sbhd as bshd and back (dims 0 and 1 swapped); on a DTensor the shards follow.
at::Tensor swapped(const at::Tensor& t) { return t.transpose(0, 1); }
DTensor swapped(const DTensor& t) {
  std::vector<Placement> p = t.placements();
  for (Placement& x : p) {
    if (is_shard(x, 0)) {
      x = Shard{1};
    } else if (is_shard(x, 1)) {
      x = Shard{0};
    }
  }
  std::vector<int64_t> shape = t.sizes();
  std::swap(shape[0], shape[1]);
  return DTensor::from_local(t.to_local().transpose(0, 1), t.mesh(), p, shape);
}
const at::Tensor& local(const at::Tensor& t) { return t; }
at::Tensor local(const DTensor& t) { return t.to_local(); }

// The attention output in q's layout.
at::Tensor in_layout_of(const at::Tensor& out, const at::Tensor&) { return out; }
DTensor in_layout_of(const at::Tensor& out, const DTensor& q) {
  std::vector<int64_t> shape = q.sizes();
  shape.back() = out.size(-1);  // v's head dim (head_dim_v)
  return DTensor::from_local(out, q.mesh(), q.placements(), shape);
}

// A tensor the logits [batch, heads, seqlen_q, seqlen_kv] read (a mask, a bias, ALiBi's slopes,
// the sink logits) as this rank's operand: `batch_dim` and `head_dim` are its dims that broadcast
// against the logits' batch and heads (-1: none). On one device it is the tensor itself. On a
// mesh, given whole (the same on every rank) or as a parameter's DTensor: where q splits its
// batch (dim 0) or heads (dim 2) over a mesh axis, a full-size batch or head dim is split alike
// (its gradient gathered back), and a dim of one or an absent one stays whole, its gradient a
// partial sum over that axis (reduced): every rank gets the whole gradient one process computes.
at::Tensor logits_operand(const at::Tensor& t, const at::Tensor&, int64_t, int64_t) { return t; }
at::Tensor logits_operand(const DTensor& t, const DTensor& q, int64_t batch_dim, int64_t head_dim) {
  std::vector<Placement> target, grads;
  for (const Placement& p : q.placements()) {
    const int64_t dim = is_shard(p, 0) ? batch_dim : is_shard(p, 2) ? head_dim : -2;
    if (dim == -2) {
      target.push_back(Replicate{});
      grads.push_back(Replicate{});
    } else if (dim >= 0 && t.size(dim) > 1) {
      target.push_back(Shard{dim});
      grads.push_back(Shard{dim});
    } else {
      target.push_back(Replicate{});
      grads.push_back(Partial{});
    }
  }
  return t.redistribute(target, grads).to_local();
}
at::Tensor logits_operand(const at::Tensor& t, const DTensor& q, int64_t batch_dim,
                          int64_t head_dim) {
  if (!t.defined()) return t;
  const std::vector<Placement> whole(static_cast<std::size_t>(q.mesh().ndim()), Replicate{});
  return logits_operand(DTensor::from_local(t, q.mesh(), whole, t.sizes().vec()), q, batch_dim,
                        head_dim);
}

// The unfused path's constraint on the attention weights [batch, heads, sq, sk], which carry
// q's batch and head shards. On one device it validates the constraint; the two sequence dims
// stay unnamed, since one logical name may not shard two dims of a tensor.
std::function<at::Tensor(const at::Tensor&)> logits_constraint(const at::Tensor&,
                                                               const at::Tensor&) {
  return [](const at::Tensor& logits) {
    return with_sharding_constraint(logits, {"batch", "heads", std::nullopt, std::nullopt});
  };
}
std::function<at::Tensor(const at::Tensor&)> logits_constraint(const DTensor& q, const DTensor& k) {
  std::vector<Placement> weights = q.placements();
  for (Placement& p : weights) {
    if (is_shard(p, 2)) p = Shard{1};
  }
  const std::vector<int64_t> shape = {q.size(0), q.size(2), q.size(1), k.size(1)};
  const DeviceMesh mesh = q.mesh();
  return [weights, shape, mesh](const at::Tensor& logits) {
    return with_sharding_constraint(DTensor::from_local(logits, mesh, weights, shape),
                                    {"batch", "heads", std::nullopt, std::nullopt})
        .redistribute(weights)
        .to_local();
  };
}

// What F::attention computes with on this rank: the options' and the args' terms, checked whole
// and then taken as this rank's operands.
template <typename T>
F::AttentionCall attention_call(const DotProductAttentionImpl& self, const Arranged<T>& a,
                                const at::Tensor& mask, const AttentionArgs& args, bool training) {
  TE_CHECK(!args.rotary_pos_emb().defined(),
           "DotProductAttention takes no rotary_pos_emb: rotate q and k first "
           "(functional::apply_rotary_pos_emb), or give it to MultiHeadAttention or "
           "TransformerLayer");
  const int64_t batch = a.q.size(0), heads = a.q.size(2), sq = a.q.size(1), sk = a.k.size(1);
  const bool packed = self.options.qkv_format() == "thd";
  // The head dims it was built with, as TE asserts them (dot_product_attention.py L1716-1725).
  const int64_t dv =
      self.options.head_dim_v() ? self.options.head_dim_v() : self.options.head_dim();
  TE_CHECK(a.q.size(3) == self.options.head_dim() && a.k.size(3) == self.options.head_dim() &&
               a.v.size(3) == dv,
           "DotProductAttention: q ", detail::shape_of(a.q), ", k ", detail::shape_of(a.k), ", v ",
           detail::shape_of(a.v), " (as bshd) do not have head_dim ", self.options.head_dim(),
           " (q, k) and ", dv, " (v) in their last dim");
  F::AttentionCall call;
  call.spec = self.mask_spec;
  if (packed) {
    // Packed sequences (a batch of one here): F::attention checks them and the bias per
    // sequence; there is no mask.
    TE_CHECK(!mask.defined(),
             "DotProductAttention: qkv_format 'thd' takes no mask: "
             "AttentionArgs' cu_seqlens_q and cu_seqlens_kv say where each sequence is");
    call.packed = {args.cu_seqlens_q(),         args.cu_seqlens_kv(), args.cu_seqlens_q_padded(),
                   args.cu_seqlens_kv_padded(), args.max_seqlen_q(),  args.max_seqlen_kv()};
    TE_CHECK(call.packed.cu_seqlens_q.defined() && call.packed.cu_seqlens_kv.defined(),
             "DotProductAttention: qkv_format 'thd' needs AttentionArgs' cu_seqlens_q and "
             "cu_seqlens_kv");
  } else {
    TE_CHECK(!args.cu_seqlens_q().defined() && !args.cu_seqlens_kv().defined() &&
                 !args.cu_seqlens_q_padded().defined() && !args.cu_seqlens_kv_padded().defined(),
             "DotProductAttention: cu_seqlens are for qkv_format 'thd'; this one's is '",
             self.options.qkv_format(),
             "' (whole sequences; a padding mask says which are padding)");
    TE_CHECK((args.max_seqlen_q() == 0 || args.max_seqlen_q() == sq) &&
                 (args.max_seqlen_kv() == 0 || args.max_seqlen_kv() == sk),
             "DotProductAttention: max_seqlen_q ", args.max_seqlen_q(), " / max_seqlen_kv ",
             args.max_seqlen_kv(), " differ from the ", sq, " queries and ", sk,
             " keys of qkv_format '", self.options.qkv_format(), "' (give 0 or the seqlen dims)");
    // The global mask and bias, checked before a mesh narrows them to this rank's batch rows
    // and heads.
    call.mask = effective_mask(self.mask_spec, mask);
    F::check_attention_mask(call.mask, call.spec, batch, heads, sq, sk);
    F::check_attention_bias(args.core_attention_bias_type(), args.core_attention_bias(),
                            args.alibi_slopes(), batch, heads, sq, sk);
  }
  call.mask = logits_operand(call.mask, a.q, 0, 1);
  call.bias_type = args.core_attention_bias_type();
  call.bias = logits_operand(args.core_attention_bias(), a.q, 0, 1);
  if (call.bias_type == "alibi") {
    // Every layout takes its share of the global heads' slopes (TE computes its default slopes
    // for the heads of its partition: under tensor parallelism they would differ by layout).
    const at::Tensor slopes =
        args.alibi_slopes().defined() ? args.alibi_slopes() : F::alibi_slopes(heads);
    call.alibi_slopes =
        slopes.dim() == 1 ? logits_operand(slopes, a.q, -1, 0) : logits_operand(slopes, a.q, 0, 1);
  }
  call.softmax_type = self.options.softmax_type();
  if (self.softmax_offset.defined()) {
    call.softmax_offset =
        logits_operand(detail::param(self, "softmax_offset", self.softmax_offset, a.q), a.q, -1, 0);
  }
  call.scale = logit_scale(self.options);
  call.dropout = self.options.attention_dropout();
  call.training = training;
  call.fused = fused_available(self.options.fused());
  call.global_batch = batch;
  call.batch_offset = a.batch_offset;
  call.global_heads = heads;
  call.head_offset = a.head_offset;
  return call;
}

// DotProductAttention's one forward, on [batch, seqlen, heads, head_dim] (packed sequences: a
// batch of one, which F::attention takes as [tokens, heads, head_dim]).
template <typename T>
T bshd_forward(const DotProductAttentionImpl& self, const T& query, const T& key, const T& value,
               const at::Tensor& mask, const AttentionArgs& args, bool training) {
  const Arranged<T> a = arrange(query, key, value);
  F::AttentionCall call = attention_call(self, a, mask, args, training);
  if (call.packed.defined()) {
    return in_layout_of(
        F::attention(local(a.q).squeeze(0), local(a.k).squeeze(0), local(a.v).squeeze(0), call)
            .unsqueeze(0),
        a.q);
  }
  if (!call.fused) call.on_logits = logits_constraint(a.q, a.k);
  return in_layout_of(F::attention(local(a.q), local(a.k), local(a.v), call), a.q);
}

// q, k, v have the dims of the options' qkv_format.
template <typename T>
void check_format_dims(const DotProductAttentionImpl& self, const T& query, const T& key,
                       const T& value) {
  const std::string& format = self.options.qkv_format();
  const int64_t dims = format == "thd" ? 3 : 4;
  TE_CHECK(query.dim() == dims && key.dim() == dims && value.dim() == dims,
           "DotProductAttention: q ", detail::shape_of(query), ", k ", detail::shape_of(key),
           ", v ", detail::shape_of(value), " are not ",
           format == "thd"    ? "[tokens, heads, head_dim]"
           : format == "sbhd" ? "[seqlen, batch, heads, head_dim]"
                              : "[batch, seqlen, heads, head_dim]",
           " (qkv_format '", format, "')");
}

// Steps whose sequences bring at most this many new tokens attend with F::paged_attention.
constexpr int64_t kPagedAttentionMaxQueries = 4;

// Attention over a key/value cache (AttentionArgs::inference_params): q, k and v are the step's
// new tokens packed as a batch of one, [1, tokens, heads, head_dim]. Their keys and values join
// the cache, and each sequence's queries attend over its cached keys with the bottom-right
// diagonal. On a mesh each rank caches and attends over its own heads.
template <typename T>
T cached_attention(const DotProductAttentionImpl& self, const T& query, const T& key,
                   const T& value, const AttentionArgs& args) {
  InferenceParams& cache = *args.inference_params();
  TE_CHECK(!self.is_training() || self.options.attention_dropout() == 0.0,
           "MultiHeadAttention: a KV cache is for inference; call eval() first");
  TE_CHECK(args.core_attention_bias_type() == "no_bias" && !args.cu_seqlens_q().defined() &&
               !args.cu_seqlens_kv().defined() && !args.cu_seqlens_q_padded().defined() &&
               !args.cu_seqlens_kv_padded().defined(),
           "MultiHeadAttention: with a KV cache the cache says where each sequence is; give no "
           "cu_seqlens and no bias (core_attention_bias_type '",
           args.core_attention_bias_type(), "')");
  TE_CHECK(self.mask_spec.type != "arbitrary",
           "MultiHeadAttention: attn_mask_type 'arbitrary' cannot run with a KV cache (the "
           "cache's sequences decide the mask); use a causal or padding type");
  const Arranged<T> a = arrange(query, key, value);
  F::AttentionCall call;
  call.spec = self.mask_spec;
  if (call.spec.causal()) {  // TE's conversion for a cache: the bottom-right diagonal
    call.spec.type = "padding_causal_bottom_right";
    call.spec.bottom_right = true;
  } else {
    call.spec.type = "padding";
  }
  call.softmax_type = self.options.softmax_type();
  if (self.softmax_offset.defined()) {
    call.softmax_offset =
        logits_operand(detail::param(self, "softmax_offset", self.softmax_offset, a.q), a.q, -1, 0);
  }
  call.scale = logit_scale(self.options);
  call.fused = fused_available(self.options.fused());
  call.global_heads = a.q.size(2);
  call.head_offset = a.head_offset;
  const at::Tensor q = local(a.q).squeeze(0);
  const int64_t layer = args.layer_number();
  if (cache.max_seqlen_q() <= kPagedAttentionMaxQueries &&
      F::paged_attention_supported(q,
                                   q.new_empty({0}, q.options().dtype(cache.options().dtype())))) {
    // Decoding: straight from the pools (no gathered copy of the cache). Longer chunks of
    // prompts are GEMMs, which BLAS runs faster than the kernel's loops.
    cache.store(layer, local(a.k).squeeze(0), local(a.v).squeeze(0));
    const auto [k_pool, v_pool] = cache.pools(layer);
    return in_layout_of(F::paged_attention(q, k_pool, v_pool, cache.kv_rows(), cache.cu_seqlens_q(),
                                           cache.seqlens_kv(), call)
                            .unsqueeze(0),
                        a.q);
  }
  // TE's cache format: the keys and values [batch, max_seqlen_kv, kv heads, head_dim]; the new
  // queries padded alike to [batch, max_seqlen_q]: one batched attention with the padding mask.
  const auto [k_all, v_all] = cache.step(layer, local(a.k).squeeze(0), local(a.v).squeeze(0));
  call.mask = cache.padding_mask().to(k_all.device());
  const at::Tensor rows = cache.query_rows().to(q.device());
  const int64_t n = cache.batch_size(), mq = cache.max_seqlen_q();
  const at::Tensor q_padded = at::zeros({n * mq, q.size(1), q.size(2)}, q.options())
                                  .index_copy(0, rows, q)
                                  .view({n, mq, q.size(1), q.size(2)});
  const at::Tensor out = F::attention(q_padded, k_all, v_all, call);
  return in_layout_of(
      out.reshape({n * mq, out.size(2), out.size(3)}).index_select(0, rows).unsqueeze(0), a.q);
}

// In the options' qkv_format.
template <typename T>
T attention_forward(const DotProductAttentionImpl& self, const T& query, const T& key,
                    const T& value, const at::Tensor& mask, const AttentionArgs& args,
                    bool training) {
  const std::string& format = self.options.qkv_format();
  check_format_dims(self, query, key, value);
  if (format == "sbhd") {
    return swapped(
        bshd_forward(self, swapped(query), swapped(key), swapped(value), mask, args, training));
  }
  if (format == "thd") {
    return detail::tokens_only(bshd_forward(self, detail::batch_of_one(query),
                                            detail::batch_of_one(key), detail::batch_of_one(value),
                                            mask, args, training));
  }
  return bshd_forward(self, query, key, value, mask, args, training);
}

}  // namespace

at::Tensor DotProductAttentionImpl::forward(const at::Tensor& query, const at::Tensor& key,
                                            const at::Tensor& value, const at::Tensor& mask,
                                            const AttentionArgs& args) {
  return attention_forward(*this, query, key, value, mask, args, is_training());
}

DTensor DotProductAttentionImpl::forward(const DTensor& query, const DTensor& key,
                                         const DTensor& value, const at::Tensor& mask,
                                         const AttentionArgs& args) {
  return attention_forward(*this, query, key, value, mask, args, is_training());
}

std::string DotProductAttentionImpl::fused_backend(const at::Tensor& query, const at::Tensor& key,
                                                   const at::Tensor& value, const at::Tensor& mask,
                                                   const AttentionArgs& args) const {
  const std::string& format = options.qkv_format();
  check_format_dims(*this, query, key, value);
  const at::Tensor q = format == "sbhd"  ? swapped(query)
                       : format == "thd" ? detail::batch_of_one(query)
                                         : query;
  const at::Tensor k = format == "sbhd"  ? swapped(key)
                       : format == "thd" ? detail::batch_of_one(key)
                                         : key;
  const at::Tensor v = format == "sbhd"  ? swapped(value)
                       : format == "thd" ? detail::batch_of_one(value)
                                         : value;
  const F::AttentionCall call = attention_call(*this, arrange(q, k, v), mask, args, is_training());
  if (call.packed.defined()) {
    return F::attention_plan(q.squeeze(0), k.squeeze(0), v.squeeze(0), call).backend;
  }
  return F::attention_plan(q, k, v, call).backend;
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
  TE_CHECK(options.qkv_format() == "bshd" || options.qkv_format() == "thd",
           "MultiHeadAttention: qkv_format '", options.qkv_format(),
           "' is not 'bshd' or 'thd' ('sbhd' is DotProductAttention's only)");
  TE_CHECK(options.qkv_format() != "thd" || options.self_attention(),
           "MultiHeadAttention: qkv_format 'thd' is for self attention; cross attention takes "
           "bshd here");
  TE_CHECK(options.qkv_format() != "thd" || !options.enable_sequence_parallel(),
           "MultiHeadAttention: qkv_format 'thd' with enable_sequence_parallel is not supported "
           "(sequence parallel splits the packed tokens): shard the heads only");
  // Resolved (and warned about) once here; the attention gets the resolved window.
  const F::MaskSpec spec = F::mask_spec(options.attn_mask_type(), options.window_size(),
                                        options.bottom_right_diagonal());
  if (const auto& type = options.qk_norm_type()) {
    TE_CHECK(*type == "RMSNorm" || *type == "LayerNorm" || *type == "L2Normalization",
             "MultiHeadAttention: qk_norm_type '", *type,
             "' is not one of RMSNorm, LayerNorm, L2Normalization");
    if (*type != "L2Normalization") {
      const auto norm = LayerNormOptions(d)
                            .layernorm_type(*type == "RMSNorm" ? "rmsnorm" : "layernorm")
                            .epsilon(options.qk_norm_eps());
      q_norm = register_module("q_norm", LayerNorm(norm));
      k_norm = register_module("k_norm", LayerNorm(norm));
    }
  }
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
              .softmax_type(options.softmax_type())
              .scale_factor(options.scale_attn_logits() ? 1.0 / std::sqrt(double(d)) : 1.0)
              .fused(options.fused_attention())
              .qkv_format(options.qkv_format())));
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
  const bool qkv_bias_on = options.qkv_bias().value_or(options.use_bias());
  if (options.self_attention() && options.fuse_qkv() && g == heads) {
    at::Tensor w = kernel({hidden, 3, heads * d});
    w.select(1, 0).mul_(query_scale);
    qkv_kernel = register_sharded(*this, "qkv_kernel", w, options.qkv_kernel_axes());
    qkv_fp8 = register_fp8_gemm(*this, "qkv_");
    if (qkv_bias_on) {
      qkv_bias = register_sharded(*this, "qkv_bias", at::zeros({3, heads * d}),
                                  output_axes(options.qkv_kernel_axes()));
    }
  } else {
    q_kernel = register_sharded(*this, "q_kernel", kernel({hidden, heads * d}) * query_scale,
                                options.q_kernel_axes());
    kv_kernel =
        register_sharded(*this, "kv_kernel", kernel({hidden, 2, g * d}), options.kv_kernel_axes());
    q_fp8 = register_fp8_gemm(*this, "q_");
    kv_fp8 = register_fp8_gemm(*this, "kv_");
    if (qkv_bias_on) {
      q_bias = register_sharded(*this, "q_bias", at::zeros({heads * d}),
                                output_axes(options.q_kernel_axes()));
      kv_bias = register_sharded(*this, "kv_bias", at::zeros({2, g * d}),
                                 output_axes(options.kv_kernel_axes()));
    }
  }
  out_kernel =
      register_sharded(*this, "out_kernel", kernel({heads * d, hidden}), options.out_kernel_axes());
  out_fp8 = register_fp8_gemm(*this, "out_");
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

// TE's qk-norm on a query or key [batch, seqlen, heads, head_dim].
template <typename T>
T qk_normalized(const MultiHeadAttentionImpl& self, LayerNorm norm, const T& t) {
  if (!self.options.qk_norm_type()) return t;
  return norm ? norm->forward(t) : l2_normalize(t, self.options.qk_norm_eps());
}

// MultiHeadAttention's one forward (modules/src/forward.h): the output and the input norm's.
template <typename T>
std::pair<T, T> mha_forward(MultiHeadAttentionImpl& self, const T& x_in,
                            const detail::Memory<T>& memory, const at::Tensor& mask,
                            const AttentionArgs& args) {
  detail::enter(self, "MultiHeadAttention", x_in);
  const MultiHeadAttentionOptions& o = self.options;
  const bool packed = o.qkv_format() == "thd";
  if (packed && x_in.dim() == 2) {  // [tokens, hidden]: run as a batch of one
    const auto [y, ln] = mha_forward(self, detail::batch_of_one(x_in), memory, mask, args);
    return {detail::tokens_only(y), detail::tokens_only(ln)};
  }
  TE_CHECK(x_in.dim() == 3 && x_in.size(2) == o.hidden_size() && (!packed || x_in.size(0) == 1),
           "MultiHeadAttention: input ", detail::shape_of(x_in), " is not ",
           packed ? "[tokens, " : "[batch, seqlen, ", o.hidden_size(), "]",
           packed ? " (or [1, tokens, hidden]) for qkv_format 'thd'" : "");
  TE_CHECK(o.self_attention() != detail::has(memory), "MultiHeadAttention: ",
           o.self_attention() ? "self attention takes no memory; build it with "
                                "self_attention(false) for cross attention"
                              : "cross attention needs the memory to attend to");
  const int64_t heads = o.num_attention_heads(), d = self.head_dim(), g = self.kv_heads();
  const LogicalAxes act = {"batch", axis::seqlen(o.enable_sequence_parallel()), "hidden"};
  // The projections take whole sequences (sequence parallel's gather, folded into their
  // matmuls on a mesh, so its backward is a reduce-scatter).
  const LogicalAxes whole = {"batch", "seqlen", "hidden"};
  const LogicalAxes per_head = {"batch", "seqlen", "heads", std::nullopt};

  const T x = with_sharding_constraint(x_in, act);
  const T ln = o.input_layernorm() ? self.layernorm->forward(x) : x;
  T q, k, v;
  if (self.qkv_fp8) {  // fused (its kernel may be held in FP8)
    T qkv =
        detail::project(self, ln, "qkv_", self.qkv_kernel, self.qkv_bias, self.qkv_fp8, whole, {});
    qkv = with_sharding_constraint(F::unflatten(qkv, 3, heads, d),
                                   {"batch", "seqlen", "joined", "heads", std::nullopt});
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
  q = with_sharding_constraint(q, per_head);
  k = with_sharding_constraint(k, per_head);
  v = with_sharding_constraint(v, per_head);
  // With a KV cache the step's tokens are packed sequences: a batch of one.
  InferenceParams* const cache = args.inference_params();
  const int64_t batch = x.size(0), seqlen = x.size(1);
  if (cache) {
    TE_CHECK(o.self_attention(),
             "MultiHeadAttention: a KV cache is for self attention; this one is cross attention");
    TE_CHECK(!packed, "MultiHeadAttention: a KV cache takes bshd input (its own packing)");
    TE_CHECK(batch * seqlen == cache->new_tokens() &&
                 (batch == 1 || (batch == cache->batch_size() &&
                                 cache->max_seqlen_q() * batch == cache->new_tokens())),
             "MultiHeadAttention: input ", detail::shape_of(x),
             " does not hold the KV cache "
             "step's ",
             cache->new_tokens(), " new tokens of ", cache->batch_size(), " sequences: give [1, ",
             cache->new_tokens(),
             ", hidden] (packed in pre_step's "
             "order), or [batch, s, hidden] when every sequence brings s");
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
  AttentionArgs attention_args = args;
  if (args.rotary_pos_emb().defined() && (packed || cache)) {
    // Positions restart at each sequence's (padded) start (multi_head_attention.py L1156-1181),
    // or with a cache go on from each sequence's cached length (L1152-1153).
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
    q = detail::batch_of_one(F::apply_rotary_pos_emb(detail::tokens_only(q), args.rotary_pos_emb(),
                                                     "thd", o.rotary_pos_interleaved(), cu_q,
                                                     start));
    k = detail::batch_of_one(F::apply_rotary_pos_emb(detail::tokens_only(k), args.rotary_pos_emb(),
                                                     "thd", o.rotary_pos_interleaved(), cu_kv,
                                                     start));
    attention_args.rotary_pos_emb(at::Tensor());
  } else if (args.rotary_pos_emb().defined()) {
    q = F::apply_rotary_pos_emb(q, args.rotary_pos_emb(), "bshd", o.rotary_pos_interleaved());
    k = F::apply_rotary_pos_emb(k, args.rotary_pos_emb(), "bshd", o.rotary_pos_interleaved());
    attention_args.rotary_pos_emb(at::Tensor());
  }
  if (!o.qk_norm_before_rope()) {
    q = qk_normalized(self, self.q_norm, q);
    k = qk_normalized(self, self.k_norm, k);
  }
  T attended;
  if (cache) {
    TE_CHECK(!mask.defined(),
             "MultiHeadAttention: a KV cache takes no mask (the cache says "
             "which keys each sequence has)");
    attended = cached_attention(*self.attention, q, k, v, attention_args);
    if (batch != 1) attended = F::unflatten(F::flatten(attended, 0), 0, batch, seqlen);
  } else if (packed) {
    attended =
        detail::batch_of_one(self.attention->forward(detail::tokens_only(q), detail::tokens_only(k),
                                                     detail::tokens_only(v), mask, attention_args));
  } else {
    attended = self.attention->forward(q, k, v, mask, attention_args);
  }
  const T out = F::flatten(attended, 2);
  // Tensor parallel: the output constraint is the all-reduce (or reduce-scatter).
  return {detail::project(self, out, "out_", self.out_kernel, self.out_bias, self.out_fp8,
                          {"batch", "seqlen", "hidden_tp"}, act),
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
  if (qkv_fp8) out.push_back({"qkv_kernel", &qkv_kernel, qkv_fp8});
  if (q_fp8) out.push_back({"q_kernel", &q_kernel, q_fp8});
  if (kv_fp8) out.push_back({"kv_kernel", &kv_kernel, kv_fp8});
  out.push_back({"out_kernel", &out_kernel, out_fp8});
  return out;
}

}  // namespace te::nn
