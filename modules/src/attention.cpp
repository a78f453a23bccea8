#include "te/nn/attention.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <cmath>

#include "attention_detail.h"
#include "attention_operands.h"
#include "attention_piece.h"
#include "constrain.h"
#include "forward.h"
#include "te/compat.h"
#include "te/error.h"
#include "te/fp8.h"
#include "te/nn/context_parallel.h"
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
  TE_CHECK(options.softcap() >= 0 && std::isfinite(options.softcap()),
           "DotProductAttention: softcap ", options.softcap(),
           " is not a finite cap >= 0 (0: no soft-capping)");
  TE_CHECK(options.qkv_format() != QkvFormat::kThd || mask_spec.padding(),
           "DotProductAttention: qkv_format 'thd' needs a padding attn_mask_type (padding, "
           "padding_causal or padding_causal_bottom_right), as TE's; got '",
           options.attn_mask_type(), "'");
  TE_CHECK(!options.cp_load_balanced() || options.cp_comm_type(),
           "DotProductAttention: cp_load_balanced is set without cp_comm_type; it orders a "
           "sequence split by context parallelism: set cp_comm_type too, or unset it");
  // TE's softmax_offset (dot_product_attention.py L772-783 at d0067d0da): zeros, one per head,
  // a parameter for "learnable" ("off-by-one" adds a constant zero, no parameter).
  if (options.softmax_type() == SoftmaxType::kLearnable) {
    softmax_offset = register_sharded(*this, "softmax_offset",
                                      at::zeros({options.num_attention_heads()}), {axis::kHeads});
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
  if (options.softmax_type() != SoftmaxType::kVanilla) {
    stream << ", softmax=" << options.softmax_type();
  }
  if (options.softcap() > 0) stream << ", softcap=" << options.softcap();
  if (options.cp_comm_type()) {
    stream << ", cp_comm_type=" << te_name(*options.cp_comm_type())
           << (options.cp_load_balanced() ? " (load balanced)" : "");
  }
  stream << ", dropout=" << options.attention_dropout() << ")";
}

namespace {
double logit_scale(const DotProductAttentionOptions& options) {
  return options.scale_factor() != 0.0 ? options.scale_factor()
                                       : 1.0 / std::sqrt(static_cast<double>(options.head_dim()));
}
}  // namespace

namespace {

using detail::arrange;
using detail::Arranged;
using detail::in_layout_of;
using detail::local;
using detail::logits_constraint;
using detail::logits_operand;
using detail::swapped;

// Packed sequences (a batch of one, or rows of them): F::attention checks them and the bias per
// sequence; there is no mask.
F::PackedSequences packed_sequences(const at::Tensor& mask, const AttentionArgs& args,
                                    int64_t batch) {
  TE_CHECK(!mask.defined(),
           "DotProductAttention: qkv_format 'thd' takes no mask: "
           "AttentionArgs' cu_seqlens_q and cu_seqlens_kv say where each sequence is");
  const F::PackedSequences packed = {args.cu_seqlens_q(),        args.cu_seqlens_kv(),
                                     args.cu_seqlens_q_padded(), args.cu_seqlens_kv_padded(),
                                     args.max_seqlen_q(),        args.max_seqlen_kv()};
  TE_CHECK(packed.cu_seqlens_q.defined() && packed.cu_seqlens_kv.defined(),
           "DotProductAttention: qkv_format 'thd' needs AttentionArgs' cu_seqlens_q and "
           "cu_seqlens_kv");
  for (const at::Tensor& cu : {packed.cu_seqlens_q, packed.cu_seqlens_kv}) {
    TE_CHECK(cu.dim() != 2 || cu.size(0) == batch, "DotProductAttention: cu_seqlens ", cu.sizes(),
             " for ", batch, " rows of packed sequences: give [rows, sequences + 1]");
  }
  TE_CHECK(packed.cu_seqlens_q.dim() != 2 || !args.alibi_slopes().defined() ||
               args.alibi_slopes().dim() == 1,
           "DotProductAttention: alibi_slopes ", args.alibi_slopes().sizes(),
           " per sequence with rows of packed sequences; give [heads]");
  return packed;
}

// What F::attention computes with on this rank: the options' and the args' terms, checked whole
// and then taken as this rank's operands.
template <typename T>
F::AttentionCall attention_call(const DotProductAttentionImpl& self, const Arranged<T>& a,
                                const at::Tensor& mask, const AttentionArgs& args, bool training) {
  TE_CHECK(!args.rotary_pos_emb().defined() && args.rotary_attention_factor() == 1.0,
           "DotProductAttention takes no rotary_pos_emb (nor rotary_attention_factor): rotate q "
           "and k first "
           "(functional::apply_rotary_pos_emb), or give it to MultiHeadAttention or "
           "TransformerLayer");
  const int64_t batch = a.q.size(0), heads = a.q.size(2), sq = a.q.size(1), sk = a.k.size(1);
  const bool packed = self.options.qkv_format() == QkvFormat::kThd;
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
    call.packed = packed_sequences(mask, args, batch);
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
  if (call.bias_type == AttnBiasType::kAlibi) {
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
  call.softcap = self.options.softcap();
  call.dropout = self.options.attention_dropout();
  call.training = training;
  call.fused = self.options.fused();
  auto piece = std::make_shared<F::detail::AttentionPiece>();
  piece->global_batch = batch;
  piece->batch_offset = a.batch_offset;
  piece->global_heads = heads;
  piece->head_offset = a.head_offset;
  call.piece = std::move(piece);
  return call;
}

// Rows of packed sequences (2-D cu_seqlens): this rank's rows as one packed batch of
// [rows * tokens, heads, head_dim] and F::attention's call for it, each sequence drawing dropout
// from its place among every row's.
struct RowsCall {
  F::AttentionCall call;
  at::Tensor q, k, v;
};
template <typename T>
RowsCall packed_rows_call(const Arranged<T>& a, const F::AttentionCall& call) {
  const at::Tensor q = local(a.q), k = local(a.k), v = local(a.v);
  const F::PackedSequences& s = call.packed;
  // A row's whole tokens (under context parallelism each rank holds a share of every row's).
  const F::PackedRows pq =
      F::packed_rows(s.cu_seqlens_q, s.cu_seqlens_q_padded, a.q.size(1), a.batch_offset, q.size(0),
                     "DotProductAttention", "cu_seqlens_q");
  const F::PackedRows pk =
      F::packed_rows(s.cu_seqlens_kv, s.cu_seqlens_kv_padded, a.k.size(1), a.batch_offset,
                     k.size(0), "DotProductAttention", "cu_seqlens_kv");
  TE_CHECK(pq.sequences == pk.sequences, "DotProductAttention: cu_seqlens_q has ", pq.sequences + 1,
           " entries a row but cu_seqlens_kv has ", pk.sequences + 1);
  TE_CHECK((s.max_seqlen_q <= 0 || s.max_seqlen_q >= pq.max_seqlen) &&
               (s.max_seqlen_kv <= 0 || s.max_seqlen_kv >= pk.max_seqlen),
           "DotProductAttention: max_seqlen_q ", s.max_seqlen_q, " / max_seqlen_kv ",
           s.max_seqlen_kv, " are shorter than the longest sequence of the rows (", pq.max_seqlen,
           " / ", pk.max_seqlen, " tokens)");
  RowsCall out{call, q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1)};
  out.call.packed = {pq.cu_seqlens,        pk.cu_seqlens,  pq.cu_seqlens_padded,
                     pk.cu_seqlens_padded, s.max_seqlen_q, s.max_seqlen_kv};
  auto piece = std::make_shared<F::detail::AttentionPiece>(F::detail::piece_of(call));
  piece->global_sequences = a.q.size(0) * pq.sequences;
  piece->sequence_offset = a.batch_offset * pq.sequences;
  piece->global_seqlen_q = s.max_seqlen_q > 0 ? s.max_seqlen_q : pq.max_seqlen;
  piece->global_seqlen_kv = s.max_seqlen_kv > 0 ? s.max_seqlen_kv : pk.max_seqlen;
  out.call.piece = std::move(piece);
  return out;
}

// Context parallelism: the sequence split over mesh dims a.cp_dims in cp's chunks; packed
// sequences (thd) in TE's layout, each rank holding its chunks of every sequence (of every row).
at::Tensor cp_attention(const Arranged<at::Tensor>& a, const F::AttentionCall& call, CpCommType,
                        bool) {
  return F::attention(a.q, a.k, a.v, call);  // one device: the whole sequence is here
}
at::Tensor cp_attention(const Arranged<DTensor>& a, F::AttentionCall call, CpCommType type,
                        bool load_balanced) {
  const DeviceMesh& mesh = a.q.mesh();
  std::vector<std::string> axes;
  for (int64_t d : a.cp_dims) axes.push_back(mesh.axis_names()[static_cast<std::size_t>(d)]);
  const F::ContextParallel cp(mesh, axes, type, load_balanced);
  TE_CHECK(a.q.size(1) % cp.size() == 0, "DotProductAttention: a sequence of ", a.q.size(1),
           " tokens does not split evenly over the ", cp.size(), " ranks of mesh ",
           axes.size() == 1 ? "axis '" : "axes '", cp.axis(),
           "' (context parallelism); pad it to a multiple");
  if (call.packed.defined() && call.packed.cu_seqlens_q.dim() == 2) {  // rows: one packed batch
    const RowsCall r = packed_rows_call(a, call);
    const at::Tensor out = F::context_parallel_attention(r.q, r.k, r.v, r.call, cp);
    return out.view({local(a.q).size(0), -1, out.size(1), out.size(2)});
  }
  if (call.packed.defined()) {
    return F::context_parallel_attention(local(a.q).squeeze(0), local(a.k).squeeze(0),
                                         local(a.v).squeeze(0), call, cp)
        .unsqueeze(0);
  }
  return F::context_parallel_attention(local(a.q), local(a.k), local(a.v), call, cp);
}

// DotProductAttention's one forward, on [batch, seqlen, heads, head_dim] (packed sequences: a
// batch of one, which F::attention takes as [tokens, heads, head_dim], or rows of them).
template <typename T>
T bshd_forward(const DotProductAttentionImpl& self, const T& query, const T& key, const T& value,
               const at::Tensor& mask, const AttentionArgs& args, bool training) {
  const auto& cp_type = self.options.cp_comm_type();
  const Arranged<T> a =
      arrange(query, key, value, cp_type ? std::optional<CpCommType>(*cp_type) : std::nullopt);
  F::AttentionCall call = attention_call(self, a, mask, args, training);
  if (!a.cp_dims.empty()) {
    return in_layout_of(cp_attention(a, call, *cp_type, self.options.cp_load_balanced()), a.q);
  }
  if (call.packed.defined() && call.packed.cu_seqlens_q.dim() == 2) {
    const RowsCall r = packed_rows_call(a, call);
    const at::Tensor out = F::attention(r.q, r.k, r.v, r.call);
    return in_layout_of(out.view({local(a.q).size(0), -1, out.size(1), out.size(2)}), a.q);
  }
  if (call.packed.defined()) {
    return in_layout_of(
        F::attention(local(a.q).squeeze(0), local(a.k).squeeze(0), local(a.v).squeeze(0), call)
            .unsqueeze(0),
        a.q);
  }
  if (!call.fused) {
    auto piece = std::make_shared<F::detail::AttentionPiece>(*call.piece);
    piece->on_logits = logits_constraint(a.q, a.k);
    call.piece = std::move(piece);
  }
  return in_layout_of(F::attention(local(a.q), local(a.k), local(a.v), call), a.q);
}

// q, k, v have the dims of the options' qkv_format.
template <typename T>
void check_format_dims(const DotProductAttentionImpl& self, const T& query, const T& key,
                       const T& value) {
  const QkvFormat format = self.options.qkv_format();
  // thd: packed sequences, or rows of them (2-D cu_seqlens).
  const int64_t dims = format == QkvFormat::kThd && query.dim() != 4 ? 3 : 4;
  TE_CHECK(query.dim() == dims && key.dim() == dims && value.dim() == dims,
           "DotProductAttention: q ", detail::shape_of(query), ", k ", detail::shape_of(key),
           ", v ", detail::shape_of(value), " are not ",
           format == QkvFormat::kThd    ? "[tokens, heads, head_dim] (or [rows, tokens, heads, "
                                          "head_dim] with 2-D cu_seqlens)"
           : format == QkvFormat::kSbhd ? "[seqlen, batch, heads, head_dim]"
                                        : "[batch, seqlen, heads, head_dim]",
           " (qkv_format '", format, "')");
}

// thd's q is [tokens, heads, head_dim] with 1-D cu_seqlens, or [rows, tokens, heads, head_dim]
// (rows of packed sequences) with 2-D ones.
template <typename T>
void check_packed_rows(const T& query, const AttentionArgs& args) {
  const bool rows = query.dim() == 4;
  for (const at::Tensor& cu : {args.cu_seqlens_q(), args.cu_seqlens_kv(),
                               args.cu_seqlens_q_padded(), args.cu_seqlens_kv_padded()}) {
    TE_CHECK(!cu.defined() || cu.dim() == (rows ? 2 : 1), "DotProductAttention: q ",
             detail::shape_of(query), " with cu_seqlens ", cu.sizes(), ": ",
             rows ? "rows of packed sequences [rows, tokens, heads, head_dim] take 2-D "
                    "cu_seqlens [rows, sequences + 1]"
                  : "packed sequences [tokens, heads, head_dim] take 1-D cu_seqlens [sequences + "
                    "1] (2-D ones are for rows [rows, tokens, heads, head_dim])");
  }
}

// Steps whose sequences bring at most this many new tokens attend with F::paged_attention.
constexpr int64_t kPagedAttentionMaxQueries = 4;

// In the options' qkv_format.
template <typename T>
T attention_forward(const DotProductAttentionImpl& self, const T& query, const T& key,
                    const T& value, const at::Tensor& mask, const AttentionArgs& args,
                    bool training) {
  const QkvFormat format = self.options.qkv_format();
  check_format_dims(self, query, key, value);
  if (format == QkvFormat::kSbhd) {
    return swapped(
        bshd_forward(self, swapped(query), swapped(key), swapped(value), mask, args, training));
  }
  if (format == QkvFormat::kThd) {
    check_packed_rows(query, args);
    if (query.dim() == 4) return bshd_forward(self, query, key, value, mask, args, training);
    const bool cp = self.options.cp_comm_type().has_value();  // (tokens in TE's cp layout)
    return detail::tokens_only(
        bshd_forward(self, detail::batch_of_one(query, cp), detail::batch_of_one(key, cp),
                     detail::batch_of_one(value, cp), mask, args, training),
        cp);
  }
  return bshd_forward(self, query, key, value, mask, args, training);
}

}  // namespace

namespace detail {

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
  TE_CHECK(args.core_attention_bias_type() == AttnBiasType::kNoBias &&
               !args.cu_seqlens_q().defined() && !args.cu_seqlens_kv().defined() &&
               !args.cu_seqlens_q_padded().defined() && !args.cu_seqlens_kv_padded().defined(),
           "MultiHeadAttention: with a KV cache the cache says where each sequence is; give no "
           "cu_seqlens and no bias (core_attention_bias_type '",
           args.core_attention_bias_type(), "')");
  TE_CHECK(self.mask_spec.type != AttnMaskType::kArbitrary,
           "MultiHeadAttention: attn_mask_type 'arbitrary' cannot run with a KV cache (the "
           "cache's sequences decide the mask); use a causal or padding type");
  const Arranged<T> a = arrange(query, key, value);
  F::AttentionCall call;
  call.spec = self.mask_spec;
  if (call.spec.causal()) {  // TE's conversion for a cache: the bottom-right diagonal
    call.spec.type = AttnMaskType::kPaddingCausalBottomRight;
    call.spec.bottom_right = true;
  } else {
    call.spec.type = AttnMaskType::kPadding;
  }
  call.softmax_type = self.options.softmax_type();
  if (self.softmax_offset.defined()) {
    call.softmax_offset =
        logits_operand(detail::param(self, "softmax_offset", self.softmax_offset, a.q), a.q, -1, 0);
  }
  call.scale = logit_scale(self.options);
  call.softcap = self.options.softcap();
  call.fused = self.options.fused();
  auto piece = std::make_shared<F::detail::AttentionPiece>();
  piece->global_heads = a.q.size(2);
  piece->head_offset = a.head_offset;
  call.piece = std::move(piece);
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

template at::Tensor cached_attention<at::Tensor>(const DotProductAttentionImpl&, const at::Tensor&,
                                                 const at::Tensor&, const at::Tensor&,
                                                 const AttentionArgs&);
template DTensor cached_attention<DTensor>(const DotProductAttentionImpl&, const DTensor&,
                                           const DTensor&, const DTensor&, const AttentionArgs&);

}  // namespace detail

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
  const QkvFormat format = options.qkv_format();
  check_format_dims(*this, query, key, value);
  if (format == QkvFormat::kThd) check_packed_rows(query, args);
  auto as_bshd = [format](const at::Tensor& t) {
    return format == QkvFormat::kSbhd                  ? swapped(t)
           : format == QkvFormat::kThd && t.dim() == 3 ? detail::batch_of_one(t)
                                                       : t;
  };
  const at::Tensor q = as_bshd(query), k = as_bshd(key), v = as_bshd(value);
  const Arranged<at::Tensor> a = arrange(q, k, v);
  const F::AttentionCall call = attention_call(*this, a, mask, args, is_training());
  if (call.packed.defined() && call.packed.cu_seqlens_q.dim() == 2) {
    const RowsCall r = packed_rows_call(a, call);
    return F::attention_plan(r.q, r.k, r.v, r.call).backend;
  }
  if (call.packed.defined()) {
    return F::attention_plan(q.squeeze(0), k.squeeze(0), v.squeeze(0), call).backend;
  }
  return F::attention_plan(q, k, v, call).backend;
}

}  // namespace te::nn
