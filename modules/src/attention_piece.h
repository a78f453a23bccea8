#pragma once

// Where one rank's attention operands sit in the global ones: what DotProductAttention on a mesh
// (attention.cpp) tells functional::attention (attention_functional.cpp) through
// AttentionCall::piece. Internal to te::nn.

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <utility>

#include "te/nn/functional.h"

namespace te::nn::functional::detail {

struct AttentionPiece {
  /// Rewrites the [batch, heads, seqlen_q, seqlen_kv] logits of the unfused path (the sharding
  /// constraint).
  std::function<at::Tensor(const at::Tensor&)> on_logits;
  /// q, k, v are the piece at (batch_offset, head_offset) of a tensor of `global_batch` rows and
  /// `global_heads` heads (0: the local sizes), the mask, bias, slopes and softmax offset being
  /// that slice of the global ones: dropout draws from the global positions, and ALiBi's default
  /// slopes are the global heads'.
  int64_t global_batch = 0, batch_offset = 0, global_heads = 0, head_offset = 0;
  /// The global tensor's query and key lengths for dropout (0: the local ones), which a packed
  /// sequence is the top-left corner of.
  int64_t global_seqlen_q = 0, global_seqlen_kv = 0;
  /// Where this piece's queries and keys start in those (context parallelism's blocks).
  int64_t seqlen_q_offset = 0, seqlen_kv_offset = 0;
  /// Rows of packed sequences split over ranks (functional::PackedRows): every row's sequences
  /// (0: not split) and the first of this piece's, so each sequence draws dropout from its
  /// global place, with global_seqlen_q/kv the longest of every row.
  int64_t global_sequences = 0, sequence_offset = 0;
};

/// attention(q, k, v, call) on [batch, seqlen, heads, head_dim] by the unfused path (logits,
/// every mask, soft cap, sink, softmax, dropout and the product by v, each an ATen op:
/// differentiable by autograd), with `with_lse` also each row's log-sum-exp of its scaled,
/// masked logits, float32 [batch, heads, seqlen_q] (a masked row's is the masked value's, ~-1e10,
/// not -inf): what merging partial results over blocks of keys needs (context parallelism's
/// blocks with dropout). The inputs are not checked here (attention_functional.cpp).
std::pair<at::Tensor, at::Tensor> unfused_attention(const at::Tensor& q, const at::Tensor& k,
                                                    const at::Tensor& v, const AttentionCall& call,
                                                    bool with_lse);

/// A padding type's meaning for one packed sequence alone (a padding type's mask is its
/// cu_seqlens): its causal part (padding: no_mask; padding_causal: causal;
/// padding_causal_bottom_right: causal_bottom_right).
AttnMaskType unpadded_type(AttnMaskType type);

/// Packed sequence `index` of `sequences` alone: the call's piece with its dropout at row `index`
/// of the padded global [sequences, heads, max_q, max_kv] (or, packed rows split over ranks, of
/// every row's: AttentionPiece::global_sequences), the one place a packed sequence draws.
AttentionPiece packed_sequence_piece(const AttentionCall& call, int64_t index, int64_t sequences,
                                     int64_t max_q, int64_t max_kv);

/// The call's piece, or the whole (every field 0) when it has none.
inline const AttentionPiece& piece_of(const AttentionCall& call) {
  static const AttentionPiece kWhole;
  return call.piece ? *call.piece : kWhole;
}

}  // namespace te::nn::functional::detail
