// functional::attention and what decides it: Transformer Engine's mask semantics (MaskSpec), the
// padded-row rule, and the one call to at::scaled_dot_product_attention.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

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

const char* const kMaskTypes[] = {"no_mask",
                                  "padding",
                                  "causal",
                                  "padding_causal",
                                  "causal_bottom_right",
                                  "padding_causal_bottom_right",
                                  "arbitrary"};

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
  check_softmax_type(call.softmax_type);
  if (call.softmax_type == "learnable") {
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

bool has_sink(const AttentionCall& call) { return call.softmax_type != "vanilla"; }
bool biased(const AttentionCall& call) { return call.bias_type != "no_bias"; }

// The additive term of the logits after scaling ([1 | b, 1 | h, 1 | sq, sk], in the bias's own
// dtype: ALiBi's is float32, and the sum is rounded once, as TE adds it), or undefined: a
// post-scale bias or ALiBi's as they are, a pre-scale one times the scale ((qk + bias) * scale =
// qk * scale + bias * scale). ALiBi's slopes take no gradient (TE's get_alibi runs under
// no_grad); a piece of the heads (global_heads set) takes its share of the global heads' slopes.
at::Tensor scaled_bias(const at::Tensor& q, const AttentionCall& call, int64_t sq, int64_t sk) {
  if (call.bias_type == "alibi") {
    at::Tensor slopes = call.alibi_slopes.detach();
    if (!slopes.defined()) {
      slopes = call.global_heads
                   ? alibi_slopes(call.global_heads).narrow(0, call.head_offset, q.size(2))
                   : alibi_slopes(q.size(2));
    }
    return alibi_bias(slopes.to(q.device()), call.spec, call.mask, sq, sk);
  }
  if (call.bias_type == "pre_scale_bias") return call.bias * call.scale;
  if (call.bias_type == "post_scale_bias") return call.bias;
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
  // A sink has no SDPA form; dropout and a logits constraint need the probabilities; a bias that
  // needs its gradient goes the unfused way too: LibTorch's CPU flash kernel gives its additive
  // mask none (2.11 picks math for one that requires it) and not every CUDA kernel does either.
  const bool bias_grad = c.bias.defined() && c.bias.requires_grad();
  if (!c.fused || c.on_logits || (c.dropout > 0.0 && c.training) || has_sink(c) || bias_grad) {
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
#if TE_SDPA_HAS_GQA
  return at::scaled_dot_product_attention(c.q, c.k, c.v, c.bias, 0.0, c.causal, c.scale, c.gqa);
#elif TE_TORCH_VERSION_AT_LEAST(2, 1)
  return at::scaled_dot_product_attention(c.q, c.k, c.v, c.bias, 0.0, c.causal, c.scale);
#else
  return at::scaled_dot_product_attention(c.q, c.k, c.v, c.bias, 0.0, c.causal);
#endif
}
#endif

std::string window_text(const std::pair<int64_t, int64_t>& w) {
  return "(" + std::to_string(w.first) + ", " + std::to_string(w.second) + ")";
}

}  // namespace

// ---- MaskSpec --------------------------------------------------------------------------------

bool MaskSpec::causal() const { return type.find("causal") != std::string::npos; }
bool MaskSpec::padding() const { return type.rfind("padding", 0) == 0; }
bool MaskSpec::takes_mask() const { return padding() || type == "arbitrary"; }
bool MaskSpec::windowed() const { return causal() || window_left >= 0 || window_right >= 0; }

MaskSpec mask_spec(const std::string& attn_mask_type,
                   std::optional<std::pair<int64_t, int64_t>> window_size,
                   std::optional<bool> bottom_right_diagonal) {
  bool known = false;
  for (const char* t : kMaskTypes) known = known || attn_mask_type == t;
  TE_CHECK(known, "attn_mask_type '", attn_mask_type,
           "' is not one of no_mask, padding, causal, padding_causal, causal_bottom_right, "
           "padding_causal_bottom_right, arbitrary");
  MaskSpec spec;
  spec.type = attn_mask_type;
  // check_set_window_size (dot_product_attention/utils.py at d0067d0da).
  std::pair<int64_t, int64_t> w =
      spec.causal() ? std::pair<int64_t, int64_t>{-1, 0} : std::pair<int64_t, int64_t>{-1, -1};
  if (window_size) {
    const auto given = *window_size;
    if (spec.causal()) {
      if (given == std::pair<int64_t, int64_t>{-1, -1} || (given.first >= 0 && given.second != 0)) {
        w = {given.first, 0};
        warn("window_size " + window_text(given) +
             " should be (-1, 0) or (>=0, 0) for "
             "attn_mask_type=" +
             attn_mask_type + ": using " + window_text(w) + ", as TE does");
      } else {
        TE_CHECK(given.first >= -1 && given.second == 0, "window_size ", window_text(given),
                 " is not valid for attn_mask_type '", attn_mask_type,
                 "': give (-1, 0) (no window) or (left >= 0, 0)");
        w = given;
      }
    } else {
      if (given == std::pair<int64_t, int64_t>{-1, 0}) {
        warn("window_size (-1, 0) should be (-1, -1) or (>=0, >=0) for attn_mask_type=" +
             attn_mask_type + ": using (-1, -1), as TE does (a causal mask is a causal type)");
      } else {
        TE_CHECK(given == (std::pair<int64_t, int64_t>{-1, -1}) ||
                     (given.first >= 0 && given.second >= 0),
                 "window_size ", window_text(given), " is not valid for attn_mask_type '",
                 attn_mask_type, "': give (-1, -1) (no window) or (left >= 0, right >= 0)");
        w = given;
      }
    }
  }
  spec.window_left = w.first;
  spec.window_right = w.second;
  // DotProductAttention.forward: causal and padding_causal are always top-left, the
  // bottom_right types always bottom-right, the others follow bottom_right_diagonal (unset:
  // bottom-right).
  if (attn_mask_type == "causal" || attn_mask_type == "padding_causal") {
    spec.bottom_right = false;
  } else if (attn_mask_type.find("bottom_right") != std::string::npos) {
    spec.bottom_right = true;
  } else {
    spec.bottom_right = bottom_right_diagonal.value_or(true);
  }
  return spec;
}

void check_attention_mask(const at::Tensor& mask, const MaskSpec& spec, int64_t batch,
                          int64_t heads, int64_t seqlen_q, int64_t seqlen_kv) {
  if (!spec.takes_mask()) return;
  TE_CHECK(mask.defined(), "attention with attn_mask_type '", spec.type,
           "' needs a mask: a bool tensor broadcastable to [batch, ",
           spec.padding() ? "1" : "heads",
           ", seqlen_q, seqlen_kv], true where a key is masked out");
  const int64_t want[4] = {batch, heads, seqlen_q, seqlen_kv};
  bool ok = mask.dim() == 4;
  for (int64_t d = 0; ok && d < 4; ++d) ok = mask.size(d) == 1 || mask.size(d) == want[d];
  TE_CHECK(ok, "attention mask ", mask.sizes(), " does not broadcast to the logits [batch ", batch,
           ", heads ", heads, ", seqlen_q ", seqlen_q, ", seqlen_kv ", seqlen_kv,
           "]: give 4 dims, each 1 or the logits' size");
  TE_CHECK(mask.scalar_type() == at::kBool, "attention mask is ", mask.scalar_type(),
           ": give a bool tensor, true where a key is masked out");
  if (!spec.padding()) return;
  TE_CHECK(mask.size(1) == 1, "attention: the padding mask of attn_mask_type '", spec.type,
           "' has ", mask.size(1),
           " heads; it is [batch, 1, seqlen_q, seqlen_kv] (a mask per head is 'arbitrary')");
  TE_CHECK(mask.size(2) == seqlen_q || seqlen_q == seqlen_kv, "attention: the padding mask ",
           mask.sizes(), " of attn_mask_type '", spec.type,
           "' says which keys are padding but not which of the ", seqlen_q, " queries are (",
           seqlen_kv,
           " keys): give [batch, 1, seqlen_q, seqlen_kv], true where the query or the key is "
           "padding");
}

namespace {

// The padding (or arbitrary) mask as the types read it, or undefined. A self-attention padding
// mask of keys only, [batch, 1, 1, s] (TE-PyTorch's form), also hides the padded queries, as
// get_full_mask ORs it with its transpose (utils.py L1821-1827 at d0067d0da).
at::Tensor given_mask(const at::Tensor& mask, const MaskSpec& spec, int64_t sq) {
  if (!spec.takes_mask() || !mask.defined()) return {};
  if (spec.padding() && mask.size(2) == 1 && sq > 1) return mask.logical_or(mask.transpose(2, 3));
  return mask;
}

// i - j - offset for [*, *, sq, sk] logits ([1 | batch, 1, sq, sk], int64): MaskSpec's diagonal,
// as get_full_mask places the window (utils.py L1833-1861) and get_alibi its bias (L1951-1960):
// offset 0 (top-left), seqlen_kv - seqlen_q (bottom-right), or, bottom-right under a padding
// type, each sequence's valid keys minus its valid queries (counted as TE counts them: the
// queries that see key 0, the keys query 0 sees). `given` is given_mask's.
at::Tensor diagonal_distance(const at::Tensor& given, const MaskSpec& spec, int64_t sq, int64_t sk,
                             const at::TensorOptions& options) {
  const auto index = options.dtype(at::kLong);
  at::Tensor diff =
      at::arange(sq, index).view({1, 1, sq, 1}) - at::arange(sk, index).view({1, 1, 1, sk});
  if (spec.bottom_right && spec.padding() && given.defined()) {
    const at::Tensor valid = given.expand({given.size(0), 1, sq, sk}).logical_not();
    const at::Tensor seq_q = valid.select(3, 0).sum(-1), seq_kv = valid.select(2, 0).sum(-1);
    diff = diff + (seq_kv - seq_q).view({-1, 1, 1, 1});
  } else if (spec.bottom_right) {
    diff = diff + (sk - sq);
  }
  return diff;
}

}  // namespace

// get_full_mask (dot_product_attention/utils.py at d0067d0da): query i sees key j when
// i + offset - left <= j <= i + offset + right (diagonal_distance's offset). A bound of -1 is no
// bound, as TE documents window_size (-1 = unbounded). get_full_mask itself substitutes
// seqlen_kv for an unbounded left bound and seqlen_q for an unbounded right one, so its unfused
// backend hides keys j < i - seqlen_kv or j > i + seqlen_q on a top-left diagonal when
// seqlen_q > seqlen_kv + 1 or seqlen_kv > seqlen_q (flash and cuDNN, given no window, hide
// nothing there): te-cpp follows the documented meaning.
at::Tensor masked_positions(const at::Tensor& mask, const MaskSpec& spec, int64_t sq, int64_t sk,
                            const at::TensorOptions& options) {
  const at::Tensor masked = given_mask(mask, spec, sq);
  if (!spec.windowed()) return masked;
  const int64_t right = spec.causal() ? 0 : spec.window_right;
  const at::Tensor diff = diagonal_distance(masked, spec, sq, sk, options);
  at::Tensor window;
  if (spec.window_left >= 0) window = diff.gt(spec.window_left);
  if (right >= 0) window = window.defined() ? window.logical_or(diff.lt(-right)) : diff.lt(-right);
  return masked.defined() ? window.logical_or(masked) : window;
}

// ---- biases and softmax types ----------------------------------------------------------------

void check_bias_type(const std::string& t) {
  TE_CHECK(t == "no_bias" || t == "pre_scale_bias" || t == "post_scale_bias" || t == "alibi",
           "core_attention_bias_type '", t,
           "' is not one of no_bias, pre_scale_bias, post_scale_bias, alibi");
}

void check_softmax_type(const std::string& t) {
  TE_CHECK(t == "vanilla" || t == "off-by-one" || t == "learnable", "softmax_type '", t,
           "' is not one of vanilla, off-by-one, learnable");
}

at::Tensor alibi_slopes(int64_t num_heads) {
  TE_CHECK(num_heads > 0, "alibi_slopes: num_heads ", num_heads, " must be positive");
  int64_t n = 1;
  while (n * 2 <= num_heads) n *= 2;
  std::vector<float> slopes;
  for (int64_t k = 1; k <= n; ++k) {
    slopes.push_back(static_cast<float>(std::pow(std::pow(2.0, -8.0 / double(n)), double(k))));
  }
  for (int64_t k = 1; k <= 2 * (num_heads - n); k += 2) {
    slopes.push_back(static_cast<float>(std::pow(std::pow(2.0, -4.0 / double(n)), double(k))));
  }
  return at::tensor(slopes);
}

at::Tensor alibi_bias(const at::Tensor& slopes, const MaskSpec& spec, const at::Tensor& mask,
                      int64_t sq, int64_t sk) {
  TE_CHECK(slopes.dim() == 1 || slopes.dim() == 2,
           "alibi_bias: the slopes are [heads] or [batch, heads], got ", slopes.sizes());
  TE_CHECK(!(spec.padding() && spec.bottom_right) || mask.defined(), "alibi_bias: attn_mask_type '",
           spec.type, "' aligns each sequence's bottom-right corner: give its padding mask");
  const at::Tensor distance =
      diagonal_distance(given_mask(mask, spec, sq), spec, sq, sk, slopes.options());
  const at::Tensor s = slopes.to(at::kFloat);
  const at::Tensor per_head =
      slopes.dim() == 1 ? s.view({1, -1, 1, 1}) : s.view({s.size(0), s.size(1), 1, 1});
  return distance.abs().neg().to(at::kFloat) * per_head;
}

void check_attention_bias(const std::string& bias_type, const at::Tensor& bias,
                          const at::Tensor& slopes, int64_t batch, int64_t heads, int64_t sq,
                          int64_t sk) {
  check_bias_type(bias_type);
  const bool takes_bias = bias_type == "pre_scale_bias" || bias_type == "post_scale_bias";
  if (!takes_bias) {
    TE_CHECK(!bias.defined(), "attention: core_attention_bias_type '", bias_type,
             "' takes no core_attention_bias (give pre_scale_bias or post_scale_bias to add it)");
  } else {
    TE_CHECK(bias.defined(), "attention: core_attention_bias_type '", bias_type,
             "' needs core_attention_bias, [1 | batch, 1 | heads, seqlen_q, seqlen_kv]");
    bool ok =
        bias.dim() == 4 && (bias.size(0) == 1 || bias.size(0) == batch) &&
        (bias.size(1) == 1 || bias.size(1) == heads) &&
        (bias.size(2) == sq || (bias.size(2) == 1 && bias.size(0) == 1 && bias.size(1) == 1)) &&
        bias.size(3) == sk;
    TE_CHECK(ok, "attention: core_attention_bias ", bias.sizes(),
             " does not fit the logits [batch ", batch, ", heads ", heads, ", seqlen_q ", sq,
             ", seqlen_kv ", sk, "]: give [1 | batch, 1 | heads, seqlen_q, seqlen_kv] (or [1, 1, ",
             "1, seqlen_kv]), as TE's bhss, 1hss, b1ss, 11ss and 111s");
    TE_CHECK(bias.is_floating_point(), "attention: core_attention_bias is ", bias.scalar_type(),
             ": give a floating-point tensor");
  }
  if (slopes.defined()) {
    TE_CHECK(bias_type == "alibi",
             "attention: alibi_slopes are given with core_attention_bias_type '", bias_type,
             "': they need 'alibi'");
    const bool ok = (slopes.dim() == 1 && slopes.size(0) == heads) ||
                    (slopes.dim() == 2 && slopes.size(0) == batch && slopes.size(1) == heads);
    TE_CHECK(ok, "attention: alibi_slopes ", slopes.sizes(), " are not [heads ", heads,
             "] or [batch ", batch, ", heads ", heads, "]");
    TE_CHECK(slopes.is_floating_point(), "attention: alibi_slopes are ", slopes.scalar_type(),
             ": give a floating-point tensor");
  }
}

at::Tensor checked_cu_seqlens(const at::Tensor& cu_seqlens, const std::string& who,
                              const std::string& name, int64_t tokens, bool tail_padding) {
  TE_CHECK(cu_seqlens.defined(), who, ": ", name, " is missing");
  TE_CHECK(cu_seqlens.dim() == 1 && cu_seqlens.size(0) >= 2 &&
               !at::isFloatingType(cu_seqlens.scalar_type()) &&
               cu_seqlens.scalar_type() != at::kBool,
           who, ": ", name, " must be a 1-D integer tensor of [sequences + 1] >= 2 entries, got ",
           cu_seqlens.sizes(), " ", cu_seqlens.scalar_type());
  const at::Tensor cu = cu_seqlens.to(at::kCPU, at::kLong).contiguous();
  const int64_t* c = cu.data_ptr<int64_t>();
  const int64_t n = cu.size(0);
  TE_CHECK(c[0] == 0, who, ": ", name, " starts at ", c[0], ", not 0");
  for (int64_t i = 1; i < n; ++i) {
    TE_CHECK(c[i] >= c[i - 1], who, ": ", name, " decreases at entry ", i, " (", c[i - 1], " -> ",
             c[i], ")");
  }
  TE_CHECK(tail_padding ? c[n - 1] <= tokens : c[n - 1] == tokens, who, ": ", name, " ends at ",
           c[n - 1], " but there are ", tail_padding ? "only " : "", tokens, " tokens");
  return cu;
}

namespace {

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

// A padding type means, for one packed sequence alone, its causal part.
std::string unpadded_type(const std::string& type) {
  if (type == "padding") return "no_mask";
  if (type == "padding_causal") return "causal";
  return "causal_bottom_right";  // padding_causal_bottom_right
}

at::Tensor dense_attention(const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in,
                           const AttentionCall& call);

// The call one packed sequence makes: a batch of one, at row `index` of the padded global
// [sequences, heads, max_seqlen_q, max_seqlen_kv] for dropout.
AttentionCall sequence_call(const AttentionCall& call, int64_t index, int64_t sequences,
                            int64_t max_q, int64_t max_kv) {
  AttentionCall one = call;
  one.packed = {};
  one.spec.type = unpadded_type(call.spec.type);
  if (call.alibi_slopes.defined() && call.alibi_slopes.dim() == 2) {
    one.alibi_slopes = call.alibi_slopes.narrow(0, index, 1);
  }
  one.global_batch = sequences;
  one.batch_offset = index;
  one.global_seqlen_q = max_q;
  one.global_seqlen_kv = max_kv;
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
  TE_CHECK(call.bias_type == "no_bias" || call.bias_type == "alibi",
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
      !slopes.defined() || (call.bias_type == "alibi" &&
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

at::Tensor dense_attention(const at::Tensor& q, const at::Tensor& k_in, const at::Tensor& v_in,
                           const AttentionCall& call) {
  check_attention_inputs(q, k_in, v_in, call);
#if TE_HAS_SDPA
  if (const auto c = sdpa_call(q, k_in, v_in, call)) {
    return zero_dead_rows(run_sdpa(*c), c->dead).transpose(1, 2);
  }
#endif
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
  if (call.bias_type == "pre_scale_bias") {
    logits = ((logits + call.bias) * call.scale).to(q.scalar_type());
  } else {
    // TE's default (scaled query init, unscaled logits) multiplies by 1: skip the pass.
    if (call.scale != 1.0) logits = logits * call.scale;
    if (biased(call)) logits = (logits + scaled_bias(q, call, sq, sk)).to(q.scalar_type());
  }
  if (call.on_logits) logits = call.on_logits(logits);
  if (masked.defined()) logits = logits.masked_fill(masked, masked_value(q));
  // A sink (L683-711): one more logit per row, never masked, taking no value: 0 (off-by-one)
  // or the head's softmax_offset (learnable); its probability is dropped after the softmax.
  if (has_sink(call)) {
    const at::Tensor offset = call.softmax_type == "learnable"
                                  ? call.softmax_offset.to(logits.scalar_type())
                                  : at::zeros({heads}, logits.options());
    logits =
        at::cat({logits, offset.view({1, heads, 1, 1}).expand({logits.size(0), heads, sq, 1})}, -1);
  }
  at::Tensor probs = at::softmax(logits, -1, at::kFloat).to(q.scalar_type());
  if (has_sink(call)) probs = probs.narrow(-1, 0, sk);
  if (call.training && call.dropout > 0) {
    const std::vector<int64_t> global = {call.global_batch ? call.global_batch : probs.size(0),
                                         call.global_heads ? call.global_heads : probs.size(1),
                                         call.global_seqlen_q ? call.global_seqlen_q : sq,
                                         call.global_seqlen_kv ? call.global_seqlen_kv : sk};
    probs = functional::dropout(probs, call.dropout, true, global,
                                {call.batch_offset, call.head_offset, 0, 0});
  }
  const bool can_be_dead = masked.defined() && !plain_causal(call.spec, sq, sk);
  const at::Tensor v = v_in.transpose(1, 2).contiguous();  // [batch, kv_heads, sk, dv]
  return zero_dead_rows(detail::mm_any(probs.reshape({batch, kv_heads, group * sq, sk}), v)
                            .view({batch, heads, sq, v.size(3)}),
                        can_be_dead ? dead_rows(masked) : at::Tensor())
      .transpose(1, 2);
}

}  // namespace

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
  const bool sink = call.softmax_type != "vanilla";
  std::vector<float> sinks(static_cast<std::size_t>(heads), 0.0f);
  if (call.softmax_type == "learnable") {
    const at::Tensor o = call.softmax_offset.to(at::kCPU, at::kFloat).contiguous();
    std::copy(o.data_ptr<float>(), o.data_ptr<float>() + heads, sinks.begin());
  }
  const auto scale = static_cast<scalar_t>(call.scale);
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
            scores[static_cast<std::size_t>(r * max_kv + j)] = dot(qt + r * d, kj, d) * scale;
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
  TE_CHECK(call.bias_type == "no_bias" && !(call.training && call.dropout > 0),
           "paged_attention: no bias and no dropout (inference)");
  check_softmax_type(call.softmax_type);
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
