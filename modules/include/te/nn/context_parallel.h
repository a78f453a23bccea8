#pragma once

// Context parallelism: attention over a sequence split over a mesh axis (TE's cp group), each
// rank holding its share of the tokens of q, k and v, with TE's four ways of moving them
// (cp_comm_type): "p2p" (K/V round a ring, TE's AttnFuncWithCPAndKVP2P), "all_gather" (K/V
// gathered, TE's AttnFuncWithCPAndKVAllGather), "a2a" (whole sequences over a share of the
// heads, TE's AttnFuncWithCPAndQKVOA2A) and "a2a+p2p" (hierarchical: an a2a over one mesh axis
// gives each rank of it a longer piece of the sequence over a share of the heads, which then
// goes round a ring over a second axis; TE's AttnFuncWithCPAndKVP2P with a list of two groups):
// transformer_engine/pytorch/attention/dot_product_attention/ context_parallel.py at d0067d0da
// (docs/research/te-context-parallel.md has the line numbers).
//
// a2a+p2p splits the sequence over two mesh axes, the ring's major and the a2a's minor (rules
// seqlen_cp=(ring,a2a), the mesh ordering ring before a2a): the cp size is their product and a
// rank's cp rank ring_rank·a2a_size + a2a_rank, as TE's (multi_head_attention.py L702-707).
//
// The sequence layout (TE's load balancing, "DualChunkSwap"): a sequence of S tokens is cut into
// 2·cp chunks of S/(2·cp); rank r holds chunks r and 2·cp-1-r, in that order, so under a causal
// mask every rank has the same work. cp_shard gives a rank its piece of a whole tensor and
// cp_unshard puts the pieces back; without load balancing rank r holds the contiguous chunk r.
// Packed sequences (thd) always take TE's layout, sequence by sequence: each sequence's slot
// (cu_seqlens_padded, a multiple of 2·cp tokens) is cut into 2·cp chunks, and rank r holds chunks
// r and 2·cp-1-r of every sequence, in sequence order (TE's thd_get_partitioned_indices and
// get_batch_on_this_cp_rank, context_parallel.py L5257-5350 at d0067d0da); cp_shard_packed and
// cp_unshard_packed apply it. A sequence's valid tokens start its slot (the padding at its end).
//
// Example (every rank of a mesh {"cp": 4}):
//   te::nn::functional::ContextParallel cp(mesh, "cp", "p2p");
//   at::Tensor q_local = F::cp_shard(q, 1, cp.size(), cp.rank());  // and k, v
//   at::Tensor out_local = F::context_parallel_attention(q_local, k_local, v_local, call, cp);

#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "te/distributed/mesh.h"
#include "te/nn/attention_types.h"

namespace te::nn::functional {

struct AttentionCall;

/// Where a sequence is split and how attention moves it.
class ContextParallel {
 public:
  /// The sequence split over mesh axis `axis` of `mesh`, moved as `comm_type` says;
  /// `load_balanced`: the DualChunkSwap layout (TE's), else contiguous chunks. te::Error when the
  /// mesh has no such axis.
  ContextParallel(const DeviceMesh& mesh, const std::string& axis,
                  TeChoice<CpCommType> comm_type = CpCommType::kP2P, bool load_balanced = true);
  /// The sequence split over mesh axes `axes`, major to minor: one axis, or for "a2a+p2p" two,
  /// the ring's and the a2a's. te::Error naming an axis the mesh lacks, or another count.
  ContextParallel(const DeviceMesh& mesh, const std::vector<std::string>& axes,
                  TeChoice<CpCommType> comm_type, bool load_balanced = true);

  const DeviceMesh& mesh() const { return mesh_; }
  /// The mesh axis (a2a+p2p: "ring+a2a", the two joined, for messages) and its dim (one axis).
  std::string axis() const;
  int64_t mesh_dim() const;
  const std::vector<std::string>& axes() const { return axes_; }
  CpCommType comm_type() const { return comm_type_; }
  bool load_balanced() const { return load_balanced_; }
  /// The cp size (the axes' sizes' product) and this rank's index among them (major to minor).
  int64_t size() const;
  int64_t rank() const;
  /// a2a+p2p's two steps: the a2a over the minor axis, and the ring (p2p) over the major one,
  /// each with this one's load balancing.
  ContextParallel a2a_part() const;
  ContextParallel ring_part() const;

 private:
  DeviceMesh mesh_;
  std::vector<std::string> axes_;
  std::vector<int64_t> mesh_dims_;
  CpCommType comm_type_;
  bool load_balanced_;
};

/// One rank's tokens of a sequence: global start, length, and where they sit in the rank's piece;
/// `sequence`: which of the packed sequences (thd), 0 for a batch of whole ones.
struct CpChunk {
  int64_t start, length, offset;
  int64_t sequence = 0;
};
/// Rank `rank`'s chunks of a sequence of `seqlen` tokens split over `cp` ranks (two with load
/// balancing, one without). te::Error when seqlen is not a multiple of 2·cp (cp without).
std::vector<CpChunk> cp_chunks(int64_t seqlen, int64_t cp, int64_t rank, bool load_balanced = true);

/// Rank `rank`'s piece of `whole` along `dim` (its cp_chunks, concatenated). Differentiable.
at::Tensor cp_shard(const at::Tensor& whole, int64_t dim, int64_t cp, int64_t rank,
                    bool load_balanced = true);
/// The whole tensor from every rank's piece along `dim` concatenated in rank order (what an
/// all-gather of the pieces gives). Differentiable.
at::Tensor cp_unshard(const at::Tensor& rank_ordered, int64_t dim, int64_t cp,
                      bool load_balanced = true);
/// The inverse of cp_unshard: every rank's piece, in rank order, from the whole.
at::Tensor cp_rank_order(const at::Tensor& whole, int64_t dim, int64_t cp,
                         bool load_balanced = true);

/// The ranks the logical axis seqlen_cp is split over on the mesh in scope, by the rules in
/// effect (or TE's table from MeshResource cp): the cp size a layer's attention sees. 1 with no
/// mesh, or no mesh axis for seqlen_cp.
int64_t cp_size_in_scope();

/// Packed sequences (thd) in TE's layout: the index in the whole packed tensor of each of rank
/// `rank`'s tokens, in its order (int64 [tokens/cp]), for `cu_seqlens_padded` [sequences + 1]
/// (the slots; their last entry is the whole tensor's token count). te::Error when a slot is not
/// a multiple of 2·cp tokens (TE pads each sequence so: pad_thd_sequences_for_cp).
at::Tensor cp_packed_indices(const at::Tensor& cu_seqlens_padded, int64_t cp, int64_t rank);
/// Rank `rank`'s tokens of the whole packed `whole` along `dim` (TE's layout). Differentiable.
at::Tensor cp_shard_packed(const at::Tensor& whole, int64_t dim,
                           const at::Tensor& cu_seqlens_padded, int64_t cp, int64_t rank);
/// The whole packed tensor from every rank's tokens along `dim` concatenated in rank order (what
/// an all-gather of them gives). Differentiable.
at::Tensor cp_unshard_packed(const at::Tensor& rank_ordered, int64_t dim,
                             const at::Tensor& cu_seqlens_padded, int64_t cp);
/// The inverse of cp_unshard_packed: every rank's tokens, in rank order, from the whole.
at::Tensor cp_rank_order_packed(const at::Tensor& whole, int64_t dim,
                                const at::Tensor& cu_seqlens_padded, int64_t cp);

/// Attention (functional::attention's semantics) of this rank's local q [batch, seqlen/cp,
/// heads, head_dim], k and v [batch, seqlen/cp, kv_heads, head_dim] — each holding this rank's
/// tokens of the same sequence in cp's layout — over the whole sequence: the result is this
/// rank's rows of the one-process output, and gradients reach every rank's q, k, v as one
/// process's would. Collective over cp's mesh axis (every rank of it calls it alike).
/// Packed sequences (qkv_format thd): q [tokens/cp, heads, head_dim], k and v alike, this rank's
/// tokens in TE's layout (cp_shard_packed), with call.packed the whole's cu_seqlens_q/kv (one
/// set: self attention) and cu_seqlens_q/kv_padded (the slots, multiples of 2·cp; absent: the
/// sequences themselves, as TE's FusedAttention defaults them), as TE takes them: every
/// strategy, each sequence attending alone; the padding slots' rows are zeros.
/// Takes no mask, the causal types (a diagonal shared by q and k), the padding types (call.mask
/// over the whole sequence in its own order, [batch, 1, 1 | seqlen, seqlen], as one process
/// takes it; cut per block) and, with "all_gather" and "a2a", sliding windows (and there
/// off-by-one sinks); GQA; soft caps; dropout (each element's
/// mask is one process's: every block draws it at its global place from the call's one stream
/// call); no arbitrary mask, bias or learnable sinks yet. "p2p" and
/// "all_gather" run te's fused CPU kernel (float32, bfloat16, float16), and what it does not take
/// (a padding mask, dropout in training, a soft cap, `fused` off) the same blocks on the unfused
/// path under autograd (probabilities held per block for backward; p2p then receives every block
/// round the ring before computing); "a2a" runs functional::attention on whole sequences and needs
/// heads and kv_heads divisible by cp; "a2a+p2p" is the a2a over its minor axis round "p2p"
/// over its major one, and takes what both take (heads and kv_heads divisible by the a2a axis'
/// size, no window). Under a layer on a mesh, dropout is drawn at the rank's
/// place in the global batch and heads; called directly, q's batch and heads are taken as the
/// whole. Every refusal is a te::Error naming the option and what to do, as TE refuses it.
at::Tensor context_parallel_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const AttentionCall& call, const ContextParallel& cp);

}  // namespace te::nn::functional
