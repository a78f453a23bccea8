// Transformer Engine's attention masks, biases and softmax types: MaskSpec (attn_mask_type,
// window_size and the padded-row rule), the masked positions of each query, ALiBi and the checks
// of a call's bias and softmax type.

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "attention_piece.h"
#include "te/compat.h"
#include "te/error.h"
#include "te/nn/functional.h"
#include "te/sharding/context.h"

namespace te::nn::functional {

namespace {

std::string window_text(const std::pair<int64_t, int64_t>& w) {
  return "(" + std::to_string(w.first) + ", " + std::to_string(w.second) + ")";
}

}  // namespace

// ---- MaskSpec --------------------------------------------------------------------------------

bool MaskSpec::causal() const {
  return type == AttnMaskType::kCausal || type == AttnMaskType::kPaddingCausal ||
         type == AttnMaskType::kCausalBottomRight ||
         type == AttnMaskType::kPaddingCausalBottomRight;
}
bool MaskSpec::padding() const {
  return type == AttnMaskType::kPadding || type == AttnMaskType::kPaddingCausal ||
         type == AttnMaskType::kPaddingCausalBottomRight;
}
bool MaskSpec::takes_mask() const { return padding() || type == AttnMaskType::kArbitrary; }
bool MaskSpec::windowed() const { return causal() || window_left >= 0 || window_right >= 0; }

MaskSpec mask_spec(TeChoice<AttnMaskType> attn_mask_type,
                   std::optional<std::pair<int64_t, int64_t>> window_size,
                   std::optional<bool> bottom_right_diagonal) {
  MaskSpec spec;
  spec.type = attn_mask_type;
  const std::string name = attn_mask_type.name();
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
             name + ": using " + window_text(w) + ", as TE does");
      } else {
        TE_CHECK(given.first >= -1 && given.second == 0, "window_size ", window_text(given),
                 " is not valid for attn_mask_type '", attn_mask_type,
                 "': give (-1, 0) (no window) or (left >= 0, 0)");
        w = given;
      }
    } else {
      if (given == std::pair<int64_t, int64_t>{-1, 0}) {
        warn("window_size (-1, 0) should be (-1, -1) or (>=0, >=0) for attn_mask_type=" + name +
             ": using (-1, -1), as TE does (a causal mask is a causal type)");
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
  if (spec.type == AttnMaskType::kCausal || spec.type == AttnMaskType::kPaddingCausal) {
    spec.bottom_right = false;
  } else if (spec.type == AttnMaskType::kCausalBottomRight ||
             spec.type == AttnMaskType::kPaddingCausalBottomRight) {
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

void check_attention_bias(AttnBiasType bias_type, const at::Tensor& bias, const at::Tensor& slopes,
                          int64_t batch, int64_t heads, int64_t sq, int64_t sk) {
  const bool takes_bias =
      bias_type == AttnBiasType::kPreScaleBias || bias_type == AttnBiasType::kPostScaleBias;
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
    TE_CHECK(bias_type == AttnBiasType::kAlibi,
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

// ---- packed sequences --------------------------------------------------------------------

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

PackedRows packed_rows(const at::Tensor& cu_seqlens, const at::Tensor& cu_seqlens_padded,
                       int64_t tokens, int64_t row_offset, int64_t rows, const std::string& who,
                       const std::string& name) {
  TE_CHECK(cu_seqlens.defined() && cu_seqlens.dim() == 2 && cu_seqlens.size(1) >= 2, who, ": ",
           name, " for rows of packed sequences must be [rows, sequences + 1], got ",
           cu_seqlens.defined() ? cu_seqlens.sizes() : at::IntArrayRef{});
  const int64_t all_rows = cu_seqlens.size(0), n = cu_seqlens.size(1) - 1;
  TE_CHECK(row_offset >= 0 && rows >= 0 && row_offset + rows <= all_rows, who, ": rows ",
           row_offset, " ... ", row_offset + rows - 1, " of ", name, "'s ", all_rows);
  const bool padded = cu_seqlens_padded.defined();
  TE_CHECK(!padded || cu_seqlens_padded.sizes() == cu_seqlens.sizes(), who, ": ", name, "_padded ",
           cu_seqlens_padded.defined() ? cu_seqlens_padded.sizes() : at::IntArrayRef{},
           " is not the shape of ", name, " ", cu_seqlens.sizes());
  PackedRows out;
  out.sequences = n;
  out.cu_seqlens = at::empty({rows * n + 1}, at::kLong);
  out.cu_seqlens_padded = at::empty({rows * n + 1}, at::kLong);
  int64_t* cu = out.cu_seqlens.data_ptr<int64_t>();
  int64_t* start = out.cu_seqlens_padded.data_ptr<int64_t>();
  cu[0] = 0;
  for (int64_t r = 0; r < all_rows; ++r) {  // every row checked, every rank alike
    const std::string row = name + " row " + std::to_string(r);
    const at::Tensor c = checked_cu_seqlens(cu_seqlens[r], who, row, tokens, true);
    const at::Tensor p = padded ? checked_cu_seqlens(cu_seqlens_padded[r], who,
                                                     row + " (" + name + "_padded)", tokens, true)
                                : c;
    const int64_t *len = c.data_ptr<int64_t>(), *at = p.data_ptr<int64_t>();
    for (int64_t j = 0; j < n; ++j) {
      const int64_t length = len[j + 1] - len[j], slot = (j + 1 < n ? at[j + 1] : tokens) - at[j];
      TE_CHECK(at[j + 1] - at[j] >= length, who, ": sequence ", j, " of ", row, " has ", length,
               " tokens but only ", at[j + 1] - at[j], " slots in ", name, "_padded");
      out.max_seqlen = std::max(out.max_seqlen, length);
      out.longest_slot = std::max(out.longest_slot, slot);
      const int64_t local = r - row_offset;
      if (local < 0 || local >= rows) continue;
      cu[local * n + j + 1] = cu[local * n + j] + length;
      start[local * n + j] = local * tokens + at[j];
    }
  }
  start[rows * n] = rows * tokens;
  return out;
}

AttnMaskType detail::unpadded_type(AttnMaskType type) {
  if (type == AttnMaskType::kPadding) return AttnMaskType::kNoMask;
  if (type == AttnMaskType::kPaddingCausal) return AttnMaskType::kCausal;
  return AttnMaskType::kCausalBottomRight;  // padding_causal_bottom_right
}

detail::AttentionPiece detail::packed_sequence_piece(const AttentionCall& call, int64_t index,
                                                     int64_t sequences, int64_t max_q,
                                                     int64_t max_kv) {
  const AttentionPiece& rows = piece_of(call);
  AttentionPiece piece = rows;
  piece.global_batch = rows.global_sequences ? rows.global_sequences : sequences;
  piece.batch_offset = rows.sequence_offset + index;
  piece.global_seqlen_q = rows.global_sequences ? rows.global_seqlen_q : max_q;
  piece.global_seqlen_kv = rows.global_sequences ? rows.global_seqlen_kv : max_kv;
  return piece;
}

}  // namespace te::nn::functional
