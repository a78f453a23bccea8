#pragma once

// The computations of te::nn modules, on plain tensors (one device) and on DTensors (any mesh).
// The DTensor forms choose, per mesh dim, the layout each operand needs from the layouts they
// have, and declare which gradients are partial sums, so data parallel, FSDP, tensor and
// sequence parallel all follow from placements: no layout-specific code in the modules.

#include <ATen/Tensor.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "te/distributed/dtensor.h"
#include "te/distributed/ops.h"
#include "te/nn/attention_types.h"

namespace te::fp8 {
class GemmMeta;
}

namespace te::nn::functional {

namespace detail {
struct AttentionPiece;  // where a rank's operands sit in the global ones (internal)
}

/// y = x @ w, contracting x's last dim with w's first: x [..., K], w [K, *out] -> [..., *out].
/// With `fp8` (the GEMM's FP8 state) inside an enabled te::Fp8Autocast the GEMM runs in FP8
/// (te::fp8::linear), its amaxes reduced over `mesh` (the current mesh when null); inside a
/// calibrating one it records amaxes only. When `fp8` holds frozen FP8 weights (see
/// freeze_fp8_weights), `w` is ignored (it may be undefined) and the FP8 kernel is used.
/// `bias` (shaped like w's output dims), when given, is added in the GEMM where LibTorch can
/// (addmm: one pass less over the output, forward and backward). `amax_dims`: fp8::linear's (the
/// mesh dims the amaxes reduce over; nullptr: all but the pipeline's).
at::Tensor dense(const at::Tensor& x, const at::Tensor& w,
                 const std::shared_ptr<fp8::GemmMeta>& fp8 = nullptr,
                 const DeviceMesh* mesh = nullptr, const at::Tensor& bias = {},
                 const std::vector<int64_t>* amax_dims = nullptr);

/// DTensor form. Per mesh dim: x batch-sharded and w sharded -> w is gathered for use and its
/// gradient reduce-scattered back (FSDP); w sharded on an output dim -> x replicated (its
/// gradient is a partial sum: Megatron's column parallel); w sharded on K -> x split on K and a
/// Partial result (row parallel); w replicated and x batch-sharded -> w's gradient is a partial
/// sum (data parallel).
///
/// `input_axes` is the constraint on x (TE's dot input axes). It is resolved here and folded
/// into the one redistribution x goes through, so that its backward fuses with the gradient's:
/// under sequence parallelism x is all-gathered forward and its gradient reduce-scattered
/// backward, where a separate constraint would all-reduce and then slice.
///
/// With `fp8` inside an enabled Fp8Autocast, each rank's GEMM runs in FP8 on its pieces (an
/// FSDP kernel is gathered and kept for backward as FP8 codes) and the amaxes are reduced over
/// x's mesh, so every rank casts with the scales one process would use.
DTensor dense(const DTensor& x, const DTensor& w, const LogicalAxes& input_axes = {},
              const std::shared_ptr<fp8::GemmMeta>& fp8 = nullptr);

/// x @ table^T for a [rows, features] table: the tied output head (Embedding::attend), dense
/// with the table's transpose as the kernel. The table's own layout change carries its gradient,
/// so a data-parallel table's partial sum waits for GradientBuckets as a Dense kernel's does (a
/// kernel made by DTensor::from_local of the transpose would all-reduce it at once, in every
/// micro-batch).
DTensor dense_transposed(const DTensor& x, const DTensor& table);

/// y + b with b broadcast over y's leading dims (b's dims are y's last b.dim() dims). A Partial y
/// is reduced first (a bias is added once, not once per partial).
DTensor add_bias(const DTensor& y, const DTensor& b);

/// Layer norm (or RMS norm) over the last dim: gamma * norm(x) + beta; with
/// zero_centered_gamma the scale applied is (1 + gamma). `beta` may be undefined (rmsnorm).
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta,
                      double epsilon, bool zero_centered_gamma, bool rms);

/// DTensor form: x is made whole on its last dim (gathered / reduced when needed).
DTensor layer_norm(const DTensor& x, const DTensor& gamma, const std::optional<DTensor>& beta,
                   double epsilon, bool zero_centered_gamma, bool rms);

/// The parameters of TE's clamped_swiglu (gpt-oss's activation; TE's activation_params,
/// transformer_engine/pytorch/module/layernorm_mlp.py L2590-2601 at d0067d0da): the gate
/// min(x, limit) * sigmoid(alpha * min(x, limit)) times clamp(x_linear, -limit, limit) +
/// glu_linear_offset.
struct ActivationParams {
  double limit = 7.0;
  double alpha = 1.702;
  double glu_linear_offset = 1.0;
};

/// An activation of one fc1 slot by TE-JAX's name: "gelu" (tanh form, as TE's kernels),
/// "gelu_exact" (the erf form: BERT's and transformers' "gelu"; not one of TE's), "relu",
/// "silu", "quick_gelu" (x * sigmoid(1.702 x)), "squared_relu", "sigmoid", "linear", and the
/// two slots of clamped_swiglu, "clamped_silu" and "clamped_linear" (with `params`). Throws
/// te::Error naming an unknown one.
at::Tensor activation(const at::Tensor& x, const std::string& name,
                      const ActivationParams& params = {});

/// The per-slot activations an MLP's activation list names: TE-JAX's lists as they are
/// ({"gelu"}, gated {"gelu", "linear"}, ...), or one TE-PyTorch name (its `activation`: gelu,
/// geglu, qgelu, qgeglu, relu, reglu, srelu, sreglu, silu, swiglu, glu, clamped_swiglu), whose
/// gated forms take two slots, the first activated: "swiglu" is {"silu", "linear"}. Throws
/// te::Error naming an unknown name or a gated TE-PyTorch name inside a longer list.
std::vector<std::string> activation_slots(const std::vector<std::string>& activations);

/// TE's MLP activation over a [..., A, N] tensor: one activation per slot A
/// (activation_slots(activations)), multiplied together, giving [..., N].
at::Tensor mlp_activation(const at::Tensor& h, const std::vector<std::string>& activations,
                          const ActivationParams& params = {});
DTensor mlp_activation(const DTensor& h, const std::vector<std::string>& activations,
                       const ActivationParams& params = {});

/// table[ids] for integer ids of any shape and a table [rows, columns]: [ids..., columns]. An id
/// outside [0, rows) is a te::Error naming it. padding_idx (-1: none): that row's gradient is
/// zero (torch.nn.Embedding's padding_idx).
at::Tensor embedding(const at::Tensor& ids, const at::Tensor& table, int64_t padding_idx = -1);
/// On a mesh, per mesh dim: where the ids are sharded, the table is used whole there (an FSDP
/// table is gathered; its gradient returns as a reduce-scatter, a replicated one's as partial
/// sums); where they are not, the table keeps its shard: rows sharded (vocabulary-parallel,
/// Megatron's VocabParallelEmbedding) look up the ids in this rank's rows, zeros for the others,
/// and the result is Partial(sum) there; columns sharded give an output sharded on its last dim.
DTensor embedding(const DTensor& ids, const DTensor& table, int64_t padding_idx = -1);

/// Options of parallel_cross_entropy (TE-PyTorch's parallel_cross_entropy arguments).
struct CrossEntropyOptions {
  /// Mixes the one-hot target with a uniform distribution (torch's label_smoothing).
  double label_smoothing = 0.0;
  /// The mean over the tokens whose target is not ignore_idx (a scalar), else one loss per token.
  bool reduce_loss = false;
  /// Tokens with this target contribute no loss and no gradient.
  int64_t ignore_idx = -100;
};

/// Cross entropy of logits [..., vocab] against integer targets [...], computed in fp32 (the
/// result is fp32 whatever the logits' dtype), as TE's parallel_cross_entropy (cross_entropy.py
/// at d0067d0da): loss = logsumexp(x) - x[target], with label smoothing ls:
/// (1 - ls) * loss + ls * (logsumexp(x) - mean(x)). A target outside [0, vocab) that is not
/// ignore_idx is a te::Error naming it (TE gives an infinite loss).
at::Tensor parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                  const CrossEntropyOptions& options = {});
/// On a mesh, logits sharded over the vocabulary (the last dim: a vocabulary-parallel LM head)
/// are never gathered: each rank reduces its columns and three [...]-sized all-reduces (the max,
/// the sum of exponentials, the target's logit; with smoothing also the sum of logits) combine
/// them, as Megatron's vocab_parallel_cross_entropy. Unlike TE, the smoothing term sums every
/// column (TE sums only a rank's own) and reduce_loss averages over every rank's tokens, so
/// the result equals one process's on any layout.
DTensor parallel_cross_entropy(const DTensor& logits, const DTensor& target,
                               const CrossEntropyOptions& options = {});

/// x.select(dim, index); as a DTensor (te/distributed/ops.h), a dim sharded there is gathered
/// first.
at::Tensor select(const at::Tensor& x, int64_t dim, int64_t index);
using te::ops::select;
/// Splits dim `dim` into (outer, inner); on a DTensor a shard of `dim` becomes a shard of
/// `outer` when it divides it evenly (else the dim is gathered first).
at::Tensor unflatten(const at::Tensor& x, int64_t dim, int64_t outer, int64_t inner);
using te::ops::unflatten;
/// Merges dims `dim` and `dim + 1`; on a DTensor a shard of `dim` stays a shard of the merged
/// dim when even.
at::Tensor flatten(const at::Tensor& x, int64_t dim);
using te::ops::flatten;
/// a + b; on DTensors b is moved to a's layout first.
at::Tensor add(const at::Tensor& a, const at::Tensor& b);
/// cap * tanh(x / cap), each step in x's dtype (Gemma 2's soft caps of the attention logits and
/// of the head's logits: transformers 5.23.0 models/gemma2/modeling_gemma2.py).
at::Tensor soft_cap(const at::Tensor& x, double cap);
using te::ops::add;
/// `whole` (the same on every rank) laid out as `like` is: itself beside a plain tensor; beside a
/// DTensor distributed with its mesh and placements (this rank keeps its piece). E.g. position
/// or token-type ids that follow the token ids' layout.
inline at::Tensor laid_out_like(const at::Tensor& /*like*/, const at::Tensor& whole) {
  return whole;
}
using te::ops::laid_out_like;

/// Which keys each query sees: Transformer Engine's attn_mask_type, window_size and
/// bottom_right_diagonal, resolved by mask_spec() as TE's DotProductAttention resolves them
/// (transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py and
/// utils.py get_full_mask / check_set_window_size, at d0067d0da).
struct MaskSpec {
  AttnMaskType type = AttnMaskType::kNoMask;
  /// Query i sees keys i + offset - window_left ... i + offset + window_right (-1: unbounded);
  /// the causal types have window_right 0.
  int64_t window_left = -1, window_right = -1;
  /// The diagonal's alignment (offset): false, the top-left corner (offset 0); true, the
  /// bottom-right corner (offset seqlen_kv - seqlen_q, or per sequence its valid keys minus its
  /// valid queries under a padding type).
  bool bottom_right = false;

  bool causal() const;      ///< the causal types
  bool padding() const;     ///< the padding types (a padding mask is required)
  bool takes_mask() const;  ///< padding types and arbitrary: forward needs a mask
  bool windowed() const;    ///< a sliding window or a causal diagonal hides keys
};

/// The spec TE's DotProductAttention uses for these arguments. `window_size` (left, right):
/// unset means (-1, 0) for the causal types and (-1, -1) for the others; a causal type with
/// (-1, -1) or (>= 0, != 0) gets right = 0, and the others' (-1, 0) becomes (-1, -1), each with a
/// te::warn as TE warns; any other negative bound is a te::Error. `bottom_right_diagonal` (unset:
/// true but for "causal" and "padding_causal", which are always top-left; the bottom_right types
/// are always bottom-right) aligns the window. `attn_mask_type` may be TE's name (TeChoice).
MaskSpec mask_spec(TeChoice<AttnMaskType> attn_mask_type,
                   std::optional<std::pair<int64_t, int64_t>> window_size = std::nullopt,
                   std::optional<bool> bottom_right_diagonal = std::nullopt);

/// Checks the mask a type takes (nothing for the others): present, bool (true = masked out), and
/// broadcasting to the [batch, heads, seqlen_q, seqlen_kv] logits (4 dims, each 1 or the logits'
/// size); a padding type's has one head, and may be keys only ([batch, 1, 1, seqlen]) only in
/// self attention (seqlen_q == seqlen_kv: the padded queries are then the padded keys, as TE
/// takes it). Throws te::Error naming both shapes.
void check_attention_mask(const at::Tensor& mask, const MaskSpec& spec, int64_t batch,
                          int64_t heads, int64_t seqlen_q, int64_t seqlen_kv);

/// The positions spec and mask hide from each query of [*, *, seqlen_q, seqlen_kv] logits (true =
/// hidden), or undefined when nothing is hidden; `mask` is read only by the types that take one.
at::Tensor masked_positions(const at::Tensor& mask, const MaskSpec& spec, int64_t seqlen_q,
                            int64_t seqlen_kv, const at::TensorOptions& options);

/// ALiBi's default slopes for `num_heads` heads (TE's get_alibi, dot_product_attention/utils.py
/// L1926-1937 at d0067d0da; Press et al.): with n the largest power of two <= num_heads, head k
/// (1-based) of the first n has 2^(-8k/n); the remaining heads take every other slope of
/// 2n heads, 2^(-4(2k-1)/n) for k = 1 ... num_heads - n. Float32 [num_heads].
at::Tensor alibi_slopes(int64_t num_heads);

/// ALiBi's bias for [*, heads, seqlen_q, seqlen_kv] logits (TE's get_alibi, L1939-1970): query i
/// and key j get -slope * |i - j + offset|, the offset being MaskSpec's diagonal (spec's
/// bottom_right: seqlen_kv - seqlen_q, or per sequence its valid keys minus its valid queries
/// under a padding type, read from `mask`, which that needs). Under a padding type with a
/// sliding window TE's unfused backend falls back to the global offset (get_full_mask renames
/// the type "arbitrary"), its flash backend keeps each sequence's: te keeps each sequence's.
/// `slopes`: [heads] or [batch, heads] (float). Result float32, [1 | batch, heads, seqlen_q,
/// seqlen_kv].
at::Tensor alibi_bias(const at::Tensor& slopes, const MaskSpec& spec, const at::Tensor& mask,
                      int64_t seqlen_q, int64_t seqlen_kv);

/// Checks a bias and its type as TE's DotProductAttention does: pre_scale_bias and
/// post_scale_bias need a `bias` of shape [1 | batch, 1 | heads, seqlen_q, seqlen_kv] or
/// [1, 1, 1, seqlen_kv] (TE's bhss, 1hss, b1ss, 11ss, 111s; dot_product_attention.py
/// L1981-2005 at d0067d0da), the others take none; `slopes` only with "alibi", [heads] or
/// [batch, heads]. Throws te::Error naming the culprit.
void check_attention_bias(AttnBiasType bias_type, const at::Tensor& bias, const at::Tensor& slopes,
                          int64_t batch, int64_t heads, int64_t seqlen_q, int64_t seqlen_kv);

/// Packed variable-length sequences (TE's qkv_format "thd", dot_product_attention.py
/// L1446-1480 and L1781-1807 at d0067d0da): sequence i's queries are tokens
/// start_q[i] ... start_q[i] + len_q[i] - 1 of q's token dim, with len_q[i] = cu_seqlens_q[i + 1]
/// - cu_seqlens_q[i] and start_q[i] = cu_seqlens_q_padded[i] (undefined: cu_seqlens_q[i]); its
/// keys and values likewise. Tokens between one sequence's end and the next one's padded start
/// take no part: their outputs are zero and get no gradient. Each cu_seqlens is [sequences + 1],
/// integer, starting at 0 and never decreasing, all four the same length; their last entries are
/// at most the token count (tokens after the last sequence are TE's tail padding, free slots too).
/// max_seqlen_q / max_seqlen_kv (0: the longest sequence)
/// bound the lengths (a shorter one is a te::Error) and shape the global tensor dropout draws
/// from, [sequences, heads, max_seqlen_q, max_seqlen_kv], so a packed batch drops what the same
/// batch padded to those lengths drops.
struct PackedSequences {
  at::Tensor cu_seqlens_q, cu_seqlens_kv, cu_seqlens_q_padded, cu_seqlens_kv_padded;
  int64_t max_seqlen_q = 0, max_seqlen_kv = 0;
  bool defined() const { return cu_seqlens_q.defined() || cu_seqlens_kv.defined(); }
};

/// `cu_seqlens` checked (1-D integer, >= 2 entries, starting at 0, never decreasing and ending
/// at `tokens`, or with `tail_padding` at most there: TE's THD tail padding, tokens after the last
/// sequence) and returned as a CPU int64 tensor; te::Error naming `who` and `name` otherwise. The
/// one check of TE's cumulative sequence lengths (attention, RoPE).
at::Tensor checked_cu_seqlens(const at::Tensor& cu_seqlens, const std::string& who,
                              const std::string& name, int64_t tokens, bool tail_padding = false);

/// Rows of packed sequences: [rows, tokens] where each row is its own packed batch (its
/// sequences never cross into the next row), said by 2-D cu_seqlens [rows, sequences + 1] (a row
/// with fewer sequences repeats its last entry: empty sequences) and optionally 2-D
/// cu_seqlens_padded of the same shape; the tokens of a row after its last sequence are padding.
/// It is what a data-parallel mesh splits by rows (each rank attends over its own rows).
/// packed_rows() checks every row (te::Error naming `who`, `name` and the row) and returns rows
/// row_offset ... row_offset + rows - 1 as one packed batch of rows * tokens tokens:
struct PackedRows {
  /// Sequence j of row r is at r * tokens + (padded or cu)[r][j]: `cu_seqlens` the cumulative
  /// lengths, `cu_seqlens_padded` the starts (each sequence's slot reaching the next one's start,
  /// the last slot of a row its end), both [rows * sequences + 1].
  at::Tensor cu_seqlens, cu_seqlens_padded;
  /// Over every row (not only the rows returned): the longest sequence, the longest slot (a
  /// token's position in its slot is below it), and the sequences per row.
  int64_t max_seqlen = 0, longest_slot = 0, sequences = 0;
};
PackedRows packed_rows(const at::Tensor& cu_seqlens, const at::Tensor& cu_seqlens_padded,
                       int64_t tokens, int64_t row_offset, int64_t rows, const std::string& who,
                       const std::string& name);

/// What functional::attention computes with besides q, k and v.
struct AttentionCall {
  /// Which keys each query sees (MaskSpec), and the types' bool mask (true = masked out): the
  /// padding types' [batch, 1, seqlen_q, seqlen_kv] padding mask, or arbitrary's mask
  /// broadcastable to [batch, heads, seqlen_q, seqlen_kv] (undefined for the other types).
  at::Tensor mask;
  MaskSpec spec;
  /// Multiplies q k^T (TE's softmax_scale).
  double scale = 1.0;
  /// > 0: the scaled logits become softcap * tanh(logits / softcap) before the mask (Gemma 2's
  /// attn_logit_softcapping); no bias beside it. 0: none.
  double softcap = 0.0;
  /// core_attention_bias_type and its tensors: `bias` for the pre- and
  /// post-scale types, `alibi_slopes` (undefined: alibi_slopes(heads)) for "alibi". A bias that
  /// requires grad gets its gradient.
  TeChoice<AttnBiasType> bias_type = AttnBiasType::kNoBias;
  at::Tensor bias, alibi_slopes;
  /// softmax_type and, for "learnable", the [heads] sink logits (TE's
  /// softmax_offset parameter; "off-by-one" uses zeros).
  TeChoice<SoftmaxType> softmax_type = SoftmaxType::kVanilla;
  at::Tensor softmax_offset;
  /// Dropout on the probabilities (training, dropout > 0): te::nn's layout-invariant dropout.
  double dropout = 0.0;
  bool training = false;
  /// Fused where it computes the same (vanilla softmax): te's CPU kernel or
  /// at::scaled_dot_product_attention (AttentionPlan::backend says which).
  bool fused = true;
  /// Set by DotProductAttention on a mesh (internal; leave it null): where this rank's q, k, v
  /// sit in the global tensors, so that dropout draws what one process draws, and the sharding
  /// constraint of the unfused path's logits.
  std::shared_ptr<const detail::AttentionPiece> piece;
  /// q, k, v [tokens, heads, head_dim] hold packed sequences (qkv_format "thd"): where each is.
  /// The spec is then a padding type, which per sequence means its causal part; no mask, no
  /// pre- or post-scale bias (TE's thd takes none); ALiBi slopes [heads] or [sequences, heads].
  PackedSequences packed;
};

/// Attention on local [batch, seqlen, heads, head_dim] tensors (or packed [tokens, heads,
/// head_dim] ones with call.packed: each sequence attends to its own keys only, as if run alone,
/// and the result is [tokens, heads, head_dim]), as TE's unfused backend computes
/// it (dot_product_attention/backends.py L619-709 at d0067d0da): logits q k^T scaled and biased
/// as `call.bias_type` says, masked, a sink column appended for the non-vanilla softmax types
/// (and dropped after the softmax), softmax, dropout, times v. A query that sees no key (a padded
/// position, or the first rows of a bottom-right causal mask with more queries than keys) gets
/// zero probabilities: a zero output row and no gradient, as every TE backend gives it. Key/value
/// heads may be fewer (GQA): each serves heads / kv_heads query heads. Throws te::Error naming
/// a bad shape, mask, bias type, bias, slopes or softmax offset.
at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionCall& call);

/// Attention of packed new queries over a KV cache held in pools of rows, without gathering it
/// (a decoding step: te::nn::InferenceParams' layout, as vLLM's paged attention reads its
/// blocks). q [tokens, heads, d]; k_pool / v_pool [rows, kv_heads, d / dv]; sequence i's
/// queries are tokens cu_seqlens_q[i] ... cu_seqlens_q[i + 1] - 1 and its keys the pool rows
/// kv_rows[i][0 ... seqlens_kv[i] - 1] ([sequences, max keys] int64). call.spec says which keys
/// each query sees (a causal type: the bottom-right diagonal of each sequence, and its window),
/// call.scale and the softmax type as attention(); no bias, no dropout. Equal to attention() on
/// the gathered keys (within rounding: its own loops, float32 or float64 CPU tensors only; see
/// paged_attention_supported). Result [tokens, heads, dv].
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_pool, const at::Tensor& v_pool,
                           const at::Tensor& kv_rows, const at::Tensor& cu_seqlens_q,
                           const at::Tensor& seqlens_kv, const AttentionCall& call);
bool paged_attention_supported(const at::Tensor& q, const at::Tensor& k_pool);

/// What attention() runs for a set of arguments.
struct AttentionPlan {
  /// "te_flash_cpu": te's fused CPU kernel (CPU or meta float32, bfloat16 or float16 tensors,
  /// no mask tensor, bias, sink, soft cap or dropout in training: blocks of queries and keys
  /// with a running softmax in float32, the probabilities never held whole). Otherwise the
  /// backend LibTorch's scaled_dot_product_attention chooses for the call attention() makes
  /// ("flash_attention", "cudnn_attention", "efficient_attention", "math"), asked of
  /// at::_fused_sdp_choice with exactly that call's arguments; or "unfused" where attention()
  /// computes without either (no SDPA in this LibTorch, `fused` off, dropout in training, or a
  /// softmax with a sink).
  std::string backend;
  /// The causal mask goes to SDPA as its is_causal flag, with no mask tensor (the flash and
  /// cuDNN kernels stay eligible on a GPU).
  bool is_causal = false;
  /// The mask or bias goes to SDPA as an additive tensor (a mask, a window, a bottom-right
  /// diagonal or a bias, with causal folded into it).
  bool mask_tensor = false;
  /// Fewer key/value heads go to SDPA unrepeated (enable_gqa: CUDA half/bf16 without a mask).
  bool enable_gqa = false;
};
/// The plan attention() follows for these arguments (the same checks as attention()).
AttentionPlan attention_plan(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const AttentionCall& call);

/// Rotates `t` by the rotary frequencies `freqs` (TE's apply_rotary_pos_emb,
/// transformer_engine/pytorch/attention/rope.py at d0067d0da): each token at position p has the
/// first freqs.size(-1) dims of each head rotated by the angles freqs[p] (the rest pass through),
/// in halves (x_i with x_{i + d2/2}) or, `interleaved`, in pairs (x_{2i} with x_{2i+1}). The
/// arithmetic is in float32 as TE's fused kernel does it (common/fused_rope/fused_rope.cu), and
/// the result has t's dtype.
///   t: [s, b, h, d] ("sbhd"), [b, s, h, d] ("bshd") or packed [tokens, h, d] ("thd", with
///      `cu_seqlens` [sequences + 1]: sequence i is tokens cu_seqlens[i] ... cu_seqlens[i+1] - 1,
///      its positions restart at 0).
///   freqs: [s2, 1, 1, d2], the output of RotaryPositionEmbedding, with d2 even and <= d and s2
///      covering every position used.
///   start_positions: [b] (or [sequences] under thd): sequence i's positions start at
///      start_positions[i] (decoding with a cache); undefined: at 0.
///   attention_factor: cos and sin multiplied by it (RotaryPositionEmbeddingOptions::
///      attention_factor: YaRN's, LongRoPE's); the passed-through dims are not scaled.
///   cp_size, cp_rank: t is context parallel rank cp_rank's tokens (TE's cp_size / cp_rank,
///      rope.py L321-343, L394 at d0067d0da): under thd, each sequence's chunks r and 2·cp-1-r
///      of its slot, with `cu_seqlens` the whole's slots (cu_seqlens_padded); under bshd / sbhd,
///      chunks r and 2·cp-1-r of the sequence (te/nn/context_parallel.h's load-balanced layout).
///      No start_positions then, as TE.
/// Throws te::Error naming a bad format, shape, cu_seqlens, start_positions, factor or cp rank.
at::Tensor apply_rotary_pos_emb(const at::Tensor& t, const at::Tensor& freqs,
                                const std::string& tensor_format = "sbhd", bool interleaved = false,
                                const at::Tensor& cu_seqlens = {},
                                const at::Tensor& start_positions = {},
                                double attention_factor = 1.0, int64_t cp_size = 1,
                                int64_t cp_rank = 0);
/// DTensor form: each rank rotates its piece by the global positions of its tokens, so a
/// sequence-sharded t (sequence parallel) gives what one process gives; batch and heads may be
/// sharded too (start_positions is the global [b]). A thd t's token dim must not be sharded.
DTensor apply_rotary_pos_emb(const DTensor& t, const at::Tensor& freqs,
                             const std::string& tensor_format = "sbhd", bool interleaved = false,
                             const at::Tensor& cu_seqlens = {},
                             const at::Tensor& start_positions = {}, double attention_factor = 1.0);

/// Applies an elementwise `fn` to x's local piece (a Partial x is reduced first: f(sum) is not
/// the sum of f; te/distributed/ops.h).
using te::ops::elementwise;

}  // namespace te::nn::functional
