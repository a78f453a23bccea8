// functional::attention: TE's mask semantics (MaskSpec), the padded-row rule, te's fused CPU kernel
// (flash_attention.cpp) or the one SDPA call.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "attention_meta.h"
#include "attention_piece.h"
#include "flash_attention.h"
#include "matmul.h"
#include "te/compat.h"
#include "te/error.h"
#include "te/nn/functional.h"
#include "te/nn/random.h"
#include "te/sharding/context.h"

namespace te::nn::functional {

namespace {

// Each key/value head `times` times in a row along dim 2 of [b, s, heads, d]: repeat_interleave's
// result, by an expanded view and one copy (repeat_interleave with a count reads a tensor of
// counts, which meta tensors cannot: te::nn::plan runs attention on them).
at::Tensor repeat_heads(const at::Tensor& t, int64_t times) {
  if (times == 1) return t;
  std::vector<int64_t> expanded(t.sizes().begin(), t.sizes().end());
  expanded.insert(expanded.begin() + 3, times);
  std::vector<int64_t> merged(t.sizes().begin(), t.sizes().end());
  merged[2] *= times;
  return t.unsqueeze(3).expand(expanded).reshape(merged);
}

void check_attention_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionCall& call) {
  TE_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4,
           "attention: q, k, v must be [batch, seqlen, heads, head_dim], got ", q.sizes(), ", ",
           k.sizes(), ", ", v.sizes());
  // v's head dim may differ from q's and k's (TE's kv_channels = (qk dim, v dim)).
  TE_CHECK(k.sizes().slice(0, 3) == v.sizes().slice(0, 3) && q.size(0) == k.size(0) &&
               q.size(3) == k.size(3),
           "attention: q ", q.sizes(), " k ", k.sizes(), " v ", v.sizes(),
           " disagree on batch, head_dim or key/value shape");
  TE_CHECK(k.size(2) > 0 && q.size(2) % k.size(2) == 0, "attention: ", q.size(2),
           " query heads are not a multiple of ", k.size(2), " key/value heads (GQA groups)");
  const int64_t b = q.size(0), h = q.size(2), sq = q.size(1), sk = k.size(1);
  check_attention_mask(call.mask, call.spec, b, h, sq, sk);
  check_attention_bias(call.bias_type, call.bias, call.alibi_slopes, b, h, sq, sk);
  TE_CHECK(!call.bias.defined() || call.bias.device() == q.device(),
           "attention: core_attention_bias is on ",
           call.bias.defined() ? call.bias.device() : q.device(), " but q is on ", q.device(),
           ": move the bias to q's device");
  TE_CHECK(call.softcap >= 0 && std::isfinite(call.softcap), "attention: softcap ", call.softcap,
           " is not a finite cap >= 0 (0: none)");
  TE_CHECK(call.softcap == 0 || call.bias_type == AttnBiasType::kNoBias,
           "attention: softcap takes no core_attention_bias_type beside it (got '", call.bias_type,
           "'): where the bias would go relative to the cap is not settled");
  if (call.softmax_type == SoftmaxType::kLearnable) {
    TE_CHECK(call.softmax_offset.defined() && call.softmax_offset.dim() == 1 &&
                 call.softmax_offset.size(0) == h,
             "attention: softmax_type 'learnable' needs softmax_offset of shape [", h,
             "] (one sink logit per head), got ",
             call.softmax_offset.defined() ? call.softmax_offset.sizes() : at::IntArrayRef{});
  } else {
    TE_CHECK(!call.softmax_offset.defined(), "attention: softmax_type '", call.softmax_type,
             "' takes no softmax_offset (only 'learnable' does)");
  }
}

bool has_sink(const AttentionCall& call) { return call.softmax_type != SoftmaxType::kVanilla; }
bool biased(const AttentionCall& call) { return call.bias_type != AttnBiasType::kNoBias; }

// The additive term of the logits after scaling ([1 | b, 1 | h, 1 | sq, sk], in the bias's own
// dtype: ALiBi's is float32, and the sum is rounded once, as TE adds it), or undefined: a
// post-scale bias or ALiBi's as they are, a pre-scale one times the scale ((qk + bias) * scale =
// qk * scale + bias * scale). ALiBi's slopes take no gradient (TE's get_alibi runs under
// no_grad); a piece of the heads (global_heads set) takes its share of the global heads' slopes.
at::Tensor scaled_bias(const at::Tensor& q, const AttentionCall& call, int64_t sq, int64_t sk) {
  if (call.bias_type == AttnBiasType::kAlibi) {
    at::Tensor slopes = call.alibi_slopes.defined() ? call.alibi_slopes.detach() : at::Tensor();
    if (!slopes.defined()) {
      const detail::AttentionPiece& piece = detail::piece_of(call);
      slopes = piece.global_heads
                   ? alibi_slopes(piece.global_heads).narrow(0, piece.head_offset, q.size(2))
                   : alibi_slopes(q.size(2));
    }
    return alibi_bias(slopes.to(q.device()), call.spec, call.mask, sq, sk);
  }
  if (call.bias_type == AttnBiasType::kPreScaleBias) return call.bias * call.scale;
  if (call.bias_type == AttnBiasType::kPostScaleBias) return call.bias;
  return {};
}

// -1e10 as TE fills masked logits, or fp16's lowest finite value where -1e10 does not fit. A
// finite fill keeps every row's softmax finite; the rows it would leave attending uniformly (no
// key left) are zeroed after, by zero_dead_rows.
double masked_value(const at::Tensor& q) { return q.scalar_type() == at::kHalf ? -65504.0 : -1e10; }

// The query rows of [*, *, sq, sk] masked positions that have no key left ([*, *, sq, 1]).
at::Tensor dead_rows(const at::Tensor& masked) { return masked.all(-1, /*keepdim=*/true); }

// A query row whose keys are all masked (a padded position under a padding mask) has zero
// probabilities, hence a zero output and zero gradients into q, k and v, as every TE backend
// gives it: scaled_masked_softmax scales a row whose max is the mask value by 0
// (transformer_engine/common/fused_softmax/scaled_masked_softmax.cu L313 at d0067d0da), the JAX
// fallback's softmax(..., where=) and cuDNN fused attention (tests/jax/test_fused_attn.py
// L1013-1019 requires the padded query rows of its output to be zeros). Zeroing the output row is
// the same function as zeroing the row's probabilities: nothing else reads them, and its gradient
// stops there. `out` is [b, h, sq, d]; `dead` is undefined when no row can be dead.
at::Tensor zero_dead_rows(const at::Tensor& out, const at::Tensor& dead) {
  return dead.defined() ? out.masked_fill(dead, 0) : out;
}

// Top-left causal with nothing else: SDPA's is_causal flag, and no query is ever left without a
// key (query i sees key 0). Bottom-right is the same diagonal when seqlen_q == seqlen_kv.
bool plain_causal(const MaskSpec& spec, int64_t sq, int64_t sk) {
  return spec.causal() && !spec.takes_mask() && spec.window_left < 0 &&
         (!spec.bottom_right || sq == sk);
}

#if TE_HAS_SDPA
// The one call attention() makes to at::scaled_dot_product_attention, in its [b, h, s, d]
// layout; attention_plan asks LibTorch about the same call.
struct SdpaCall {
  at::Tensor q, k, v;
  c10::optional<at::Tensor> bias;
  bool causal = false;  // is_causal: no bias tensor, so flash and cuDNN stay eligible
  c10::optional<double> scale;
  bool gqa = false;  // enable_gqa: fewer key/value heads, not repeated
  at::Tensor dead;   // the query rows to zero after the call (see zero_dead_rows)
};

std::optional<SdpaCall> sdpa_call(const at::Tensor& q, const at::Tensor& k_in,
                                  const at::Tensor& v_in, const AttentionCall& c) {
  // A sink or soft cap has no SDPA form; dropout and a logits constraint need the probabilities;
  // a bias that needs its gradient goes unfused too: LibTorch's CPU flash kernel gives its
  // additive mask none (2.11 picks math for one that requires it), nor does every CUDA kernel.
  const bool bias_grad = c.bias.defined() && c.bias.requires_grad();
  if (!c.fused || detail::piece_of(c).on_logits || (c.dropout > 0.0 && c.training) || has_sink(c) ||
      bias_grad || c.softcap > 0) {
    return std::nullopt;
  }
  const int64_t sq = q.size(1), sk = k_in.size(1);
  SdpaCall call;
  at::Tensor masked;
  const at::Tensor bias = biased(c) ? scaled_bias(q, c, sq, sk).to(q.scalar_type()) : at::Tensor();
  if (plain_causal(c.spec, sq, sk) && !bias.defined()) {
    call.causal = true;
  } else {
    masked = masked_positions(c.mask, c.spec, sq, sk, q.options());
  }
  at::Tensor k = k_in, v = v_in;
  if (k.size(2) != q.size(2)) {
    // enable_gqa spares the repeat, but of LibTorch's fused kernels only CUDA flash (half/bf16,
    // no mask) and cuDNN take it: elsewhere it would fall to the math backend.
    bool gqa = false;
#if TE_SDPA_HAS_GQA
    gqa = q.is_cuda() && !masked.defined() && !bias.defined() &&
          (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16);
#endif
    if (gqa) {
      call.gqa = true;
    } else {
      k = repeat_heads(k, q.size(2) / k_in.size(2));
      v = repeat_heads(v, q.size(2) / k_in.size(2));
    }
  }
  at::Tensor qq = q;
#if TE_TORCH_VERSION_AT_LEAST(2, 1)
  call.scale = c.scale;
#else
  // No `scale` argument before 2.1: fold the ratio to SDPA's default 1/sqrt(d) into q.
  qq = q * (c.scale / (1.0 / std::sqrt(static_cast<double>(q.size(3)))));
#endif
  call.q = qq.transpose(1, 2);
  call.k = k.transpose(1, 2);
  call.v = v.transpose(1, 2);
  if (masked.defined()) {
    call.bias = bias.defined()
                    ? at::where(masked, at::scalar_tensor(masked_value(q), q.options()), bias)
                    : at::zeros(masked.sizes(), q.options()).masked_fill(masked, masked_value(q));
    call.dead = dead_rows(masked);
  } else if (bias.defined()) {
    call.bias = bias;
  }
  return call;
}

at::Tensor run_sdpa(const SdpaCall& c) {
  if (c.q.is_meta()) return detail::meta_fused_attention(c.q, c.k, c.v);  // te::nn::plan
#if TE_SDPA_HAS_GQA
  return at::scaled_dot_product_attention(c.q, c.k, c.v, c.bias, 0.0, c.causal, c.scale, c.gqa);
#elif TE_TORCH_VERSION_AT_LEAST(2, 1)
  return at::scaled_dot_product_attention(c.q, c.k, c.v, c.bias, 0.0, c.causal, c.scale);
#else
  return at::scaled_dot_product_attention(c.q, c.k, c.v, c.bias, 0.0, c.causal);
#endif
}
#endif

// Where each packed sequence is in one token dim: start and length per sequence.
struct Packing {
  std::vector<int64_t> start, length;
  int64_t longest = 0;
};

Packing packing(const at::Tensor& cu_seqlens, const at::Tensor& padded, int64_t tokens,
                const char* side, int64_t max_seqlen) {
  const std::string name = std::string("cu_seqlens_") + side;
  const at::Tensor cu =
      checked_cu_seqlens(cu_seqlens, "attention", name, tokens, /*tail_padding=*/true);
  const int64_t n = cu.size(0) - 1;
  const int64_t* c = cu.data_ptr<int64_t>();
  Packing p;
  p.start.assign(c, c + n);
  for (int64_t i = 0; i < n; ++i) p.length.push_back(c[i + 1] - c[i]);
  if (padded.defined()) {
    const at::Tensor pc =
        checked_cu_seqlens(padded, "attention", name + "_padded", tokens, /*tail_padding=*/true);
    TE_CHECK(pc.size(0) == cu.size(0), "attention: ", name, "_padded has ", pc.size(0),
             " entries but ", name, " has ", cu.size(0), ": both are [sequences + 1]");
    const int64_t* pp = pc.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      TE_CHECK(pp[i + 1] - pp[i] >= p.length[static_cast<std::size_t>(i)], "attention: sequence ",
               i, " has ", p.length[static_cast<std::size_t>(i)], " tokens (", name, ") but only ",
               pp[i + 1] - pp[i], " slots in ", name, "_padded");
      p.start[static_cast<std::size_t>(i)] = pp[i];
    }
  }
  for (const int64_t l : p.length) p.longest = std::max(p.longest, l);
  TE_CHECK(max_seqlen <= 0 || max_seqlen >= p.longest, "attention: max_seqlen_", side, " ",
           max_seqlen, " is shorter than the longest sequence (", p.longest, " tokens) of ", name);
  return p;
}

at::Tensor dense_attention(const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in,
                           const AttentionCall& call);

// The call one packed sequence makes: a batch of one, at row `index` of the padded global
// [sequences, heads, max_seqlen_q, max_seqlen_kv] for dropout.
AttentionCall sequence_call(const AttentionCall& call, int64_t index, int64_t sequences,
                            int64_t max_q, int64_t max_kv) {
  AttentionCall one = call;
  one.packed = {};
  one.spec.type = detail::unpadded_type(call.spec.type);
  if (call.alibi_slopes.defined() && call.alibi_slopes.dim() == 2) {
    one.alibi_slopes = call.alibi_slopes.narrow(0, index, 1);
  }
  one.piece = std::make_shared<detail::AttentionPiece>(
      detail::packed_sequence_piece(call, index, sequences, max_q, max_kv));
  return one;
}

struct PackedInputs {
  Packing pq, pk;
  int64_t max_q = 0, max_kv = 0;
};

PackedInputs check_packed(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const AttentionCall& call) {
  TE_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3,
           "attention: packed q, k, v (qkv_format 'thd') must be [tokens, heads, head_dim], got ",
           q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  TE_CHECK(call.spec.padding(), "attention: qkv_format 'thd' needs a padding mask type (padding, ",
           "padding_causal or padding_causal_bottom_right), as TE's; got '", call.spec.type, "'");
  TE_CHECK(!call.mask.defined(), "attention: qkv_format 'thd' takes no mask: cu_seqlens_q and ",
           "cu_seqlens_kv say where each sequence is");
  TE_CHECK(call.bias_type == AttnBiasType::kNoBias || call.bias_type == AttnBiasType::kAlibi,
           "attention: core_attention_bias_type '", call.bias_type,
           "' is not supported with qkv_format 'thd' (TE's packed attention takes no_bias or "
           "alibi): pad the batch to bshd for a bias tensor");
  const PackedSequences& s = call.packed;
  TE_CHECK(s.cu_seqlens_q.defined() && s.cu_seqlens_kv.defined(),
           "attention: qkv_format 'thd' needs cu_seqlens_q and cu_seqlens_kv");
  PackedInputs in;
  in.pq = packing(s.cu_seqlens_q, s.cu_seqlens_q_padded, q.size(0), "q", s.max_seqlen_q);
  in.pk = packing(s.cu_seqlens_kv, s.cu_seqlens_kv_padded, k.size(0), "kv", s.max_seqlen_kv);
  TE_CHECK(in.pq.length.size() == in.pk.length.size(), "attention: cu_seqlens_q has ",
           in.pq.length.size() + 1, " entries but cu_seqlens_kv has ", in.pk.length.size() + 1,
           ": both are [sequences + 1]");
  TE_CHECK(k.sizes().slice(0, 2) == v.sizes().slice(0, 2) && q.size(2) == k.size(2),
           "attention: q ", q.sizes(), " k ", k.sizes(), " v ", v.sizes(),
           " disagree on head_dim or key/value shape");
  TE_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "attention: ", q.size(1),
           " query heads are not a multiple of ", k.size(1), " key/value heads (GQA groups)");
  // Checked whole, not only per sequence (a batch whose sequences are all empty runs none).
  TE_CHECK(!call.bias.defined(), "attention: core_attention_bias_type '", call.bias_type,
           "' takes no core_attention_bias");
  const int64_t n = static_cast<int64_t>(in.pq.length.size()), h = q.size(1);
  const at::Tensor& slopes = call.alibi_slopes;
  TE_CHECK(
      !slopes.defined() || (call.bias_type == AttnBiasType::kAlibi &&
                            ((slopes.dim() == 1 && slopes.size(0) == h) ||
                             (slopes.dim() == 2 && slopes.size(0) == n && slopes.size(1) == h))),
      "attention: alibi_slopes ", slopes.defined() ? slopes.sizes() : at::IntArrayRef{},
      " are not [heads ", h, "] or [sequences ", n, ", heads ", h,
      "] (and only core_attention_bias_type 'alibi' takes them)");
  in.max_q = s.max_seqlen_q > 0 ? s.max_seqlen_q : in.pq.longest;
  in.max_kv = s.max_seqlen_kv > 0 ? s.max_seqlen_kv : in.pk.longest;
  return in;
}

// The token dim cut into its sequences and the free slots around them (sizes for
// split_with_sizes, whose backward is one cat, where a narrow per sequence would each add a
// full-size gradient), and which segment holds sequence i.
struct Segments {
  std::vector<int64_t> sizes, of_sequence;
};
Segments segments(const Packing& p, int64_t tokens) {
  Segments s;
  int64_t at_token = 0;
  for (std::size_t i = 0; i < p.start.size(); ++i) {
    if (p.start[i] > at_token) s.sizes.push_back(p.start[i] - at_token);
    s.of_sequence.push_back(static_cast<int64_t>(s.sizes.size()));
    s.sizes.push_back(p.length[i]);
    at_token = p.start[i] + p.length[i];
  }
  if (tokens > at_token) s.sizes.push_back(tokens - at_token);
  return s;
}

// Each sequence attends alone; the free slots are zeros. One dropout call for the whole batch:
// every sequence draws its piece from the same call's stream.
at::Tensor packed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const AttentionCall& call) {
  const PackedInputs in = check_packed(q, k, v, call);
  const int64_t n = static_cast<int64_t>(in.pq.length.size());
  const Segments sq = segments(in.pq, q.size(0)), sk = segments(in.pk, k.size(0));
  const std::vector<at::Tensor> qs = q.split_with_sizes(sq.sizes),
                                ks = k.split_with_sizes(sk.sizes),
                                vs = v.split_with_sizes(sk.sizes);
  const bool draws = call.training && call.dropout > 0;
  const RngState before = rng_state();
  std::vector<at::Tensor> pieces;  // the output's segments, as q's
  for (std::size_t j = 0; j < sq.sizes.size(); ++j) {
    pieces.push_back(at::zeros({sq.sizes[j], q.size(1), v.size(2)}, q.options()));
  }
  for (int64_t i = 0; i < n; ++i) {
    const auto u = static_cast<std::size_t>(i);
    const auto jq = static_cast<std::size_t>(sq.of_sequence[u]),
               jk = static_cast<std::size_t>(sk.of_sequence[u]);
    if (in.pq.length[u] == 0 || in.pk.length[u] == 0) continue;  // no key: dead rows, zeros
    if (draws) set_rng_state(before);
    pieces[jq] = dense_attention(qs[jq].unsqueeze(0), ks[jk].unsqueeze(0), vs[jk].unsqueeze(0),
                                 sequence_call(call, i, n, in.max_q, in.max_kv))
                     .squeeze(0);
  }
  if (draws) set_rng_state({before.seed, before.calls + 1});
  return pieces.empty() ? at::zeros({0, q.size(1), v.size(2)}, q.options()) : at::cat(pieces, 0);
}

}  // namespace

std::pair<at::Tensor, at::Tensor> detail::unfused_attention(const at::Tensor& q,
                                                            const at::Tensor& k_in,
                                                            const at::Tensor& v_in,
                                                            const AttentionCall& call,
                                                            bool with_lse) {
  const int64_t heads = q.size(2), kv_heads = k_in.size(2), group = heads / kv_heads;
  const int64_t batch = q.size(0), sq = q.size(1), sk = k_in.size(1);
  const at::Tensor masked = masked_positions(call.mask, call.spec, sq, sk, q.options());
  // backends.py L619-666 at d0067d0da: (qk + bias) * scale, or qk * scale (+ bias). Fewer
  // key/value heads (GQA) are not repeated: each one's `group` query heads multiply it together,
  // [batch, kv_heads, group * sq, d] x [batch, kv_heads, d, sk], with one copy of k and of v.
  const at::Tensor k = k_in.transpose(1, 2).contiguous();  // [batch, kv_heads, sk, d]
  at::Tensor logits =
      detail::mm_any(q.transpose(1, 2).reshape({batch, kv_heads, group * sq, q.size(3)}),
                     k.transpose(2, 3))
          .view({batch, heads, sq, sk});
  if (call.bias_type == AttnBiasType::kPreScaleBias) {
    logits = ((logits + call.bias) * call.scale).to(q.scalar_type());
  } else {
    // TE's default (scaled query init, unscaled logits) multiplies by 1: skip the pass.
    if (call.scale != 1.0) logits = logits * call.scale;
    if (biased(call)) logits = (logits + scaled_bias(q, call, sq, sk)).to(q.scalar_type());
  }
  // Gemma 2's soft cap, before the mask (transformers 5.23.0 eager_attention_forward).
  if (call.softcap > 0) logits = soft_cap(logits, call.softcap);
  const detail::AttentionPiece& piece = detail::piece_of(call);
  if (piece.on_logits) logits = piece.on_logits(logits);
  if (masked.defined()) logits = logits.masked_fill(masked, masked_value(q));
  // A sink (L683-711): one more logit per row, never masked, taking no value: 0 (off-by-one)
  // or the head's softmax_offset (learnable); its probability is dropped after the softmax.
  if (has_sink(call)) {
    const at::Tensor offset = call.softmax_type == SoftmaxType::kLearnable
                                  ? call.softmax_offset.to(logits.scalar_type())
                                  : at::zeros({heads}, logits.options());
    logits =
        at::cat({logits, offset.view({1, heads, 1, 1}).expand({logits.size(0), heads, sq, 1})}, -1);
  }
  const at::Tensor lse = with_lse ? at::logsumexp(logits.to(at::kFloat), -1) : at::Tensor();
  at::Tensor probs = at::softmax(logits, -1, at::kFloat).to(q.scalar_type());
  if (has_sink(call)) probs = probs.narrow(-1, 0, sk);
  if (call.training && call.dropout > 0) {
    const std::vector<int64_t> global = {piece.global_batch ? piece.global_batch : probs.size(0),
                                         piece.global_heads ? piece.global_heads : probs.size(1),
                                         piece.global_seqlen_q ? piece.global_seqlen_q : sq,
                                         piece.global_seqlen_kv ? piece.global_seqlen_kv : sk};
    probs = functional::dropout(
        probs, call.dropout, true, global,
        {piece.batch_offset, piece.head_offset, piece.seqlen_q_offset, piece.seqlen_kv_offset});
  }
  const bool can_be_dead = masked.defined() && !plain_causal(call.spec, sq, sk);
  const at::Tensor v = v_in.transpose(1, 2).contiguous();  // [batch, kv_heads, sk, dv]
  return {zero_dead_rows(detail::mm_any(probs.reshape({batch, kv_heads, group * sq, sk}), v)
                             .view({batch, heads, sq, v.size(3)}),
                         can_be_dead ? dead_rows(masked) : at::Tensor())
              .transpose(1, 2),
          lse};
}

namespace {

at::Tensor dense_attention(const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in,
                           const AttentionCall& call) {
  check_attention_inputs(q, k_in, v_in, call);
  if (detail::flash_attention_takes(q, k_in, v_in, call)) {
    const auto window = detail::key_window(call, q.size(1), k_in.size(1));
    return detail::flash_attention(q, k_in, v_in, call.scale, window).first;
  }
#if TE_HAS_SDPA
  if (const auto c = sdpa_call(q, k_in, v_in, call)) {
    return zero_dead_rows(run_sdpa(*c), c->dead).transpose(1, 2);
  }
#endif
  return detail::unfused_attention(q, k_in, v_in, call, /*with_lse=*/false).first;
}

}  // namespace

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionCall& call) {
  if (call.packed.defined() || q.dim() == 3) return packed_attention(q, k, v, call);
  return dense_attention(q, k, v, call);
}

AttentionPlan attention_plan(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                             const AttentionCall& call_in) {
  // Packed sequences: the plan of the first one with queries and keys (each runs alike).
  at::Tensor q = q_in, k = k_in, v = v_in;
  AttentionCall call = call_in;
  if (call_in.packed.defined() || q_in.dim() == 3) {
    const PackedInputs in = check_packed(q_in, k_in, v_in, call_in);
    const int64_t n = static_cast<int64_t>(in.pq.length.size());
    for (int64_t i = 0; i < n; ++i) {
      const auto u = static_cast<std::size_t>(i);
      if (in.pq.length[u] == 0 || in.pk.length[u] == 0) continue;
      q = q_in.narrow(0, in.pq.start[u], in.pq.length[u]).unsqueeze(0);
      k = k_in.narrow(0, in.pk.start[u], in.pk.length[u]).unsqueeze(0);
      v = v_in.narrow(0, in.pk.start[u], in.pk.length[u]).unsqueeze(0);
      call = sequence_call(call_in, i, n, in.max_q, in.max_kv);
      break;
    }
    if (q.dim() == 3) return {"unfused"};  // no sequence attends
  }
  check_attention_inputs(q, k, v, call);
  AttentionPlan plan;
  if (detail::flash_attention_takes(q, k, v, call)) return {"te_flash_cpu"};
#if TE_HAS_SDPA
  if (const auto c = sdpa_call(q, k, v, call)) {
    plan.is_causal = c->causal;
    plan.mask_tensor = c->bias.has_value();
    plan.enable_gqa = c->gqa;
#if TE_SDPA_HAS_GQA
    plan.backend = compat::sdp_backend_name(
        at::_fused_sdp_choice(c->q, c->k, c->v, c->bias, 0.0, c->causal, c->scale, c->gqa));
#elif TE_TORCH_VERSION_AT_LEAST(2, 1)
    plan.backend = compat::sdp_backend_name(
        at::_fused_sdp_choice(c->q, c->k, c->v, c->bias, 0.0, c->causal, c->scale));
#else
    plan.backend =
        compat::sdp_backend_name(at::_fused_sdp_choice(c->q, c->k, c->v, c->bias, 0.0, c->causal));
#endif
    return plan;
  }
#endif
  plan.backend = "unfused";
  return plan;
}

}  // namespace te::nn::functional
