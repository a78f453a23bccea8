#pragma once

// Rotary position embeddings (RoPE, https://arxiv.org/abs/2104.09864) with Transformer Engine's
// names and semantics (transformer_engine/pytorch/attention/rope.py at d0067d0da):
// RotaryPositionEmbedding makes the frequencies, functional::apply_rotary_pos_emb rotates
// queries and keys by them, and MultiHeadAttention / TransformerLayer take them as
// `rotary_pos_emb`.

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace te::nn {

/// Options for RotaryPositionEmbedding(dim): TE's constructor arguments.
struct RotaryPositionEmbeddingOptions {
  explicit RotaryPositionEmbeddingOptions(int64_t dim) : dim_(dim) {}
  /// The rotary dimension (at most the head dim; the rest of each head passes through).
  TORCH_ARG(int64_t, dim);
  /// Rotate only int(dim * rotary_percent) dims (e.g. 0.5 for GPT-NeoX-style partial rotary).
  TORCH_ARG(double, rotary_percent) = 1.0;
  /// Position interpolation (https://arxiv.org/abs/2306.15595), with
  /// pretrained_max_position_embeddings (both or neither, as TE scales only with both): positions
  /// are divided by the factor, or, for a max_seq_len beyond pretrained * factor, multiplied by
  /// pretrained / max_seq_len (TE's dynamic linear scaling). Hugging Face's rope_scaling
  /// {"type": "linear", "factor": f} is factor f with max_seq_len <= pretrained * f.
  TORCH_ARG(std::optional<double>, seq_len_interpolation_factor) = std::nullopt;
  TORCH_ARG(std::optional<int64_t>, pretrained_max_position_embeddings) = std::nullopt;
  /// theta: inv_freq[i] = 1 / rotary_base^(2i / dim).
  TORCH_ARG(double, rotary_base) = 10000.0;
  /// Interleaved pairs (GPT-J: dims 2i, 2i+1 rotate together) instead of halves (Llama, NeoX:
  /// dims i, i + dim/2). The frequencies are laid out to match.
  TORCH_ARG(bool, interleaved) = false;
  /// Per-frequency factors: inv_freq[i] is divided by frequency_factors[i] (dim / 2 of them,
  /// each positive; empty: none). Llama 3's RoPE scaling (transformers' rope_type "llama3") is
  /// such a division, and llama.cpp stores the factors as a GGUF's rope_freqs.weight.
  TORCH_ARG(std::vector<double>, frequency_factors) = {};
  /// LongRoPE (transformers' rope_type "longrope": Phi-3's long context): a second set of
  /// per-frequency factors, used instead of frequency_factors for a sequence longer than
  /// pretrained_max_position_embeddings (which it needs). forward(max_seq_len, offset) takes it
  /// when offset + max_seq_len, the length its last position implies, is more, as transformers
  /// chooses by max(position_ids) + 1 (modeling_rope_utils.py dynamic_rope_update, 5.23.0).
  TORCH_ARG(std::vector<double>, long_frequency_factors) = {};
  /// Each cos and sin multiplied by it (transformers' attention_scaling: YaRN's 0.1 ln(factor) + 1,
  /// LongRoPE's sqrt(1 + ln(factor) / ln(original)); Megatron's mscale): the rotated dims of the
  /// queries and keys scaled by it, their logits by its square. forward()'s frequencies are angles
  /// only: give it to MultiHeadAttention with them (AttentionArgs::rotary_attention_factor) or to
  /// functional::apply_rotary_pos_emb.
  ///
  /// Example (YaRN): RotaryPositionEmbeddingOptions(128).frequency_factors(f).attention_factor(
  ///     0.1 * std::log(4.0) + 1)
  TORCH_ARG(double, attention_factor) = 1.0;
};

/// TE's RotaryPositionEmbedding: forward(max_seq_len, offset) gives the float32 frequencies
/// [max_seq_len, 1, 1, dim] of positions offset ... offset + max_seq_len - 1, each position's
/// angles repeated for the two halves (or, interleaved, for each pair). The buffer `inv_freq`
/// holds 1 / rotary_base^(2i / dim) (divided by frequency_factors), `long_inv_freq` the same
/// divided by long_frequency_factors (undefined without them).
class RotaryPositionEmbeddingImpl : public torch::nn::Cloneable<RotaryPositionEmbeddingImpl> {
 public:
  explicit RotaryPositionEmbeddingImpl(int64_t dim)
      : RotaryPositionEmbeddingImpl(RotaryPositionEmbeddingOptions(dim)) {}
  explicit RotaryPositionEmbeddingImpl(const RotaryPositionEmbeddingOptions& options);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  at::Tensor forward(int64_t max_seq_len, int64_t offset = 0);

  RotaryPositionEmbeddingOptions options;
  at::Tensor inv_freq, long_inv_freq;
};
TORCH_MODULE(RotaryPositionEmbedding);

}  // namespace te::nn
