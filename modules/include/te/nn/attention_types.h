#pragma once

// Transformer Engine's attention option values, typed: the mask, bias, softmax, qkv format and
// query/key norm kinds as enums, each spelled as TE spells it where a string comes in (a
// te::nn::TeChoice), so TE's own names keep working and a misspelling is named with the valid
// values where it is written, not when the module first runs. No LibTorch here.
//
// Example:
//   DotProductAttentionOptions(8, 32).attn_mask_type(te::nn::AttnMaskType::kPaddingCausal);
//   DotProductAttentionOptions(8, 32).attn_mask_type("padding_causal");  // TE's name, the same
//   te::nn::AttnMaskType t = te::nn::TeChoice<te::nn::AttnMaskType>("paddng");  // te::Error:
//     attn_mask_type 'paddng' is not one of no_mask, padding, causal, ...

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace te::nn {

/// TE's attn_mask_type (functional::MaskSpec says which keys each one hides).
enum class AttnMaskType {
  kNoMask,                    ///< "no_mask"
  kPadding,                   ///< "padding"
  kCausal,                    ///< "causal" (top-left diagonal)
  kPaddingCausal,             ///< "padding_causal" (top-left diagonal)
  kCausalBottomRight,         ///< "causal_bottom_right"
  kPaddingCausalBottomRight,  ///< "padding_causal_bottom_right"
  kArbitrary,                 ///< "arbitrary": the mask given to forward
};

/// TE's core_attention_bias_type.
enum class AttnBiasType {
  kNoBias,         ///< "no_bias"
  kPreScaleBias,   ///< "pre_scale_bias": softmax((q k^T + bias) * scale)
  kPostScaleBias,  ///< "post_scale_bias": softmax(q k^T * scale + bias)
  kAlibi,          ///< "alibi": a post-scale bias from ALiBi's slopes
};

/// TE's softmax_type.
enum class SoftmaxType {
  kVanilla,    ///< "vanilla"
  kOffByOne,   ///< "off-by-one": exp(0) joins each row's denominator (an attention sink)
  kLearnable,  ///< "learnable": exp(softmax_offset[h]) joins it, a parameter per head
};

/// TE's qkv_format.
enum class QkvFormat {
  kBshd,  ///< "bshd": [batch, seqlen, heads, head_dim]
  kSbhd,  ///< "sbhd": [seqlen, batch, heads, head_dim]
  kThd,   ///< "thd": packed sequences [tokens, heads, head_dim] with cu_seqlens
};

/// TE's qk_norm_type (MultiHeadAttention's norm of each query and key head).
enum class QkNormType {
  kRMSNorm,          ///< "RMSNorm"
  kLayerNorm,        ///< "LayerNorm"
  kL2Normalization,  ///< "L2Normalization"
  kNone,             ///< "none" (TE: None), the default
};

/// TE's cp_comm_type: how context parallelism moves a sequence split over a cp mesh axis
/// (functional::context_parallel_attention; docs/guide.md "Long sequences").
enum class CpCommType {
  kP2P,        ///< "p2p": K/V pass round a ring, one block computed while the next arrives
  kAllGather,  ///< "all_gather": K/V gathered whole, each query chunk attends once (Llama 3's)
  kA2A,        ///< "a2a": all-to-all to whole sequences over a share of the heads (Ulysses)
  kA2AP2P,     ///< "a2a+p2p": a2a over one mesh axis, then p2p over another (hierarchical)
};

/// TE's spelling of `value`, e.g. "padding_causal".
const char* te_name(AttnMaskType value);
const char* te_name(AttnBiasType value);
const char* te_name(SoftmaxType value);
const char* te_name(QkvFormat value);
const char* te_name(QkNormType value);
const char* te_name(CpCommType value);

/// The value TE spells `name` (case-sensitive, as TE's); te::Error naming the option, the
/// given name and every valid one otherwise. E is one of the enums above.
template <typename E>
E parse_te_name(std::string_view name);

/// TE's names of every value of E, in the enum's order (a command line's choices).
template <typename E>
std::vector<std::string> te_names();

/// An option holding one of the enums above, given as the enum or as TE's name (parsed on the
/// spot by parse_te_name). Converts to the enum: compare and switch on that.
template <typename E>
class TeChoice {
 public:
  constexpr TeChoice(E value) : value_(value) {}  // NOLINT: implicit, as the enum itself
  TeChoice(const char* name) : value_(parse_te_name<E>(name)) {}         // NOLINT
  TeChoice(const std::string& name) : value_(parse_te_name<E>(name)) {}  // NOLINT
  TeChoice(std::string_view name) : value_(parse_te_name<E>(name)) {}    // NOLINT
  constexpr operator E() const { return value_; }                        // NOLINT
  constexpr E value() const { return value_; }
  const char* name() const { return te_name(value_); }

 private:
  E value_;
};

/// Each prints TE's name.
std::ostream& operator<<(std::ostream& stream, AttnMaskType value);
std::ostream& operator<<(std::ostream& stream, AttnBiasType value);
std::ostream& operator<<(std::ostream& stream, SoftmaxType value);
std::ostream& operator<<(std::ostream& stream, QkvFormat value);
std::ostream& operator<<(std::ostream& stream, QkNormType value);
std::ostream& operator<<(std::ostream& stream, CpCommType value);
template <typename E>
std::ostream& operator<<(std::ostream& stream, TeChoice<E> choice) {
  return stream << choice.value();
}

/// A sliding window (left, right), as TE's window_size.
using WindowSize = std::pair<int64_t, int64_t>;

}  // namespace te::nn
