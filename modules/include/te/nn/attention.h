#pragma once

// te::nn::DotProductAttention and MultiHeadAttention: Transformer Engine's attention modules in
// LibTorch's module idiom. Tensors are [batch, seqlen, heads, head_dim] (BSHD).

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <optional>
#include <string>
#include <utility>

#include "te/nn/attention_types.h"
#include "te/nn/dense.h"
#include "te/nn/functional.h"
#include "te/nn/kv_cache.h"
#include "te/nn/sharded.h"

namespace te::nn {

/// AttentionArgs' (not owned) key/value cache.
using InferenceParamsPtr = InferenceParams*;

/// The per-call inputs of attention beside q, k, v and the mask: TE's forward keyword arguments
/// of DotProductAttention, MultiHeadAttention and TransformerLayer
/// (transformer_engine/pytorch/attention/dot_product_attention/dot_product_attention.py
/// L1581-1589 at d0067d0da). On a mesh the tensors are the global ones, the same on every rank;
/// their batch rows and heads shard with the attention's.
///
/// Example (BLOOM's ALiBi, Llama's RoPE):
///   mha(x, {}, mask,
///   te::nn::AttentionArgs().core_attention_bias_type(te::nn::AttnBiasType::kAlibi)); mha(x, {},
///   mask, te::nn::AttentionArgs().rotary_pos_emb(rope->forward(seqlen)));
struct AttentionArgs {
  /// no_bias, pre_scale_bias (softmax((q k^T + bias) * scale)), post_scale_bias
  /// (softmax(q k^T * scale + bias)) or alibi (-slope * |i - j + offset| per head, offset the
  /// mask's diagonal: bottom-right unless the mask type is causal or padding_causal or
  /// bottom_right_diagonal is false, per sequence under a padding type, as TE's get_alibi).
  /// `scale` is DotProductAttention's scale_factor: under MultiHeadAttention's defaults (TE-JAX's
  /// scaled_query_init, unscaled logits) it is 1 and pre- equals post-scale; TE-PyTorch's
  /// (q k^T + bias) / sqrt(head_dim) is scaled_query_init(false).scale_attn_logits(true).
  TORCH_ARG(TeChoice<AttnBiasType>, core_attention_bias_type) = AttnBiasType::kNoBias;
  /// The pre- or post-scale bias, [1 | batch, 1 | heads, seqlen_q, seqlen_kv] (or
  /// [1, 1, 1, seqlen_kv]); when it requires grad it gets its gradient (on a mesh, the whole
  /// gradient on every rank).
  TORCH_ARG(at::Tensor, core_attention_bias);
  /// ALiBi's slopes, [heads] or [batch, heads]; undefined: TE's slopes for the heads
  /// (functional::alibi_slopes), for all the heads (a sharded attention takes its heads' share,
  /// so every layout computes what one process does).
  TORCH_ARG(at::Tensor, alibi_slopes);
  /// RoPE frequencies [s, 1, 1, rotary_dim] (RotaryPositionEmbedding's output, covering the query
  /// and key/value lengths) that rotate the queries and keys after their projections, as TE's
  /// MultiHeadAttention does (apply_rotary_pos_emb, bshd). MultiHeadAttention and
  /// TransformerLayer only: DotProductAttention takes q and k as they are.
  TORCH_ARG(at::Tensor, rotary_pos_emb);
  /// The cos and sin of rotary_pos_emb multiplied by it (RotaryPositionEmbeddingOptions::
  /// attention_factor: YaRN's and LongRoPE's scaling); 1: none. Only with rotary_pos_emb.
  TORCH_ARG(double, rotary_attention_factor) = 1.0;
  /// qkv_format "thd" (packed sequences, functional::PackedSequences): sequence i is tokens
  /// cu_seqlens_q[i] ... cu_seqlens_q[i + 1] - 1 of the queries (from cu_seqlens_q_padded[i]
  /// when given: tokens between sequences take no part), likewise the keys and values;
  /// [sequences + 1] integer tensors from 0. RoPE positions restart at each sequence.
  TORCH_ARG(at::Tensor, cu_seqlens_q);
  TORCH_ARG(at::Tensor, cu_seqlens_kv);
  TORCH_ARG(at::Tensor, cu_seqlens_q_padded);
  TORCH_ARG(at::Tensor, cu_seqlens_kv_padded);
  /// The longest query and key/value sequence ("thd"; 0: read from cu_seqlens); bshd/sbhd: the
  /// seqlen dims, which they must equal when given.
  TORCH_ARG(int64_t, max_seqlen_q) = 0;
  TORCH_ARG(int64_t, max_seqlen_kv) = 0;
  /// A key/value cache (TE's inference_params; te::nn::InferenceParams, after its pre_step):
  /// MultiHeadAttention and TransformerLayer (self attention) then take the step's new tokens,
  /// packed [1, new tokens, hidden] in the cache's order (or [batch, s, hidden] when every
  /// sequence brings s), rotate them from each sequence's cached length (RoPE's
  /// start_positions), store their keys and values and attend over every cached one with the
  /// bottom-right diagonal: a causal type runs as "padding_causal_bottom_right" per sequence,
  /// as TE converts it (dot_product_attention.py L1813-1823 at d0067d0da), keeping its sliding
  /// window; "no_mask" and "padding" see every cached key. Inference only (eval mode); no mask,
  /// bias or cu_seqlens beside it. Not owned: it must outlive the call.
  TORCH_ARG(InferenceParamsPtr, inference_params) = nullptr;
  /// Which layer's cache this attention uses (TE's layer_number): distinct for each layer that
  /// shares an InferenceParams.
  TORCH_ARG(int64_t, layer_number) = 0;
};

/// Options for DotProductAttention over `num_attention_heads` heads of `head_dim`: the attention's
/// options, declared here once; MultiHeadAttentionOptions nests them as its `attention` (and
/// TransformerLayerOptions nests those as its `self_attention`), as the modules nest. The typed
/// options (attention_types.h) take the enum or TE's name.
///
/// Example:
///   te::nn::DotProductAttention dpa(te::nn::DotProductAttentionOptions(8, 32).attn_mask_type(
///       te::nn::AttnMaskType::kPaddingCausal));  // or .attn_mask_type("padding_causal")
struct DotProductAttentionOptions {
  DotProductAttentionOptions(int64_t num_attention_heads, int64_t head_dim)
      : num_attention_heads_(num_attention_heads), head_dim_(head_dim) {}
  TORCH_ARG(int64_t, num_attention_heads);
  /// The query and key head dim, which the default scale 1/sqrt(head_dim) reads. Within
  /// MultiHeadAttentionOptions 0 means its hidden_size / num_attention_heads.
  TORCH_ARG(int64_t, head_dim);
  /// The value (and output) head dim; 0: head_dim. TE's kv_channels = (head_dim, head_dim_v)
  /// (dot_product_attention.py L527-529, L731-736 at d0067d0da), e.g. DeepSeek's 192 and 128.
  TORCH_ARG(int64_t, head_dim_v) = 0;
  /// Key/value heads (GQA); 0 means num_attention_heads (plain multi-head attention).
  TORCH_ARG(int64_t, num_gqa_groups) = 0;
  /// TE's attn_mask_type: no_mask, padding, causal, padding_causal (top-left diagonal),
  /// causal_bottom_right, padding_causal_bottom_right (bottom-right diagonal: the last query sees
  /// the last key, as when decoding with a cache), or arbitrary (the mask given to forward,
  /// broadcastable to [batch, heads, seqlen_q, seqlen_kv]).
  TORCH_ARG(TeChoice<AttnMaskType>, attn_mask_type) = AttnMaskType::kCausal;
  /// Sliding window (left, right): query i sees keys i + offset - left ... i + offset + right,
  /// -1 unbounded (TE's window_size). Unset: (-1, 0) for the causal types, (-1, -1) otherwise.
  TORCH_ARG(std::optional<WindowSize>, window_size) = std::nullopt;
  /// Aligns the window's diagonal to the bottom-right corner (true) or the top-left one (false);
  /// unset: bottom-right. "causal" and "padding_causal" are always top-left, the bottom_right
  /// types always bottom-right (TE's bottom_right_diagonal).
  TORCH_ARG(std::optional<bool>, bottom_right_diagonal) = std::nullopt;
  /// Dropout on the attention probabilities (training only).
  TORCH_ARG(double, attention_dropout) = 0.0;
  /// Multiplies the logits; 0 means 1/sqrt(head_dim) (within MultiHeadAttentionOptions: as its
  /// scale_attn_logits says).
  TORCH_ARG(double, scale_factor) = 0.0;
  /// Soft-caps the scaled logits before the mask and the softmax: cap * tanh(logits / cap), as
  /// Gemma 2's attn_logit_softcapping (transformers 5.23.0 models/gemma2/modeling_gemma2.py
  /// eager_attention_forward) and flash-attention's softcap; 0: none. Takes no
  /// core_attention_bias_type beside it (where a bias would go relative to the cap is not
  /// settled); runs unfused (no SDPA form), on every path a KV cache takes too.
  TORCH_ARG(double, softcap) = 0.0;
  /// TE's softmax_type: vanilla, off-by-one (each row's denominator gains exp(0): an attention
  /// sink) or learnable (gains exp(softmax_offset[h]), a parameter of shape [heads] with logical
  /// axis "heads", initialised to zeros, as gpt-oss's sinks).
  TORCH_ARG(TeChoice<SoftmaxType>, softmax_type) = SoftmaxType::kVanilla;
  /// Fused attention where it computes the same (vanilla softmax, no bias, no dropout in
  /// training): te's own kernel on CPU tensors for the causal types, sliding windows and no mask
  /// (it never holds the [seqlen_q, seqlen_kv] probabilities), at::scaled_dot_product_attention
  /// elsewhere where this LibTorch has it (2.0+); the same numbers within rounding.
  TORCH_ARG(bool, fused) = true;
  /// TE's qkv_format: bshd ([batch, seqlen, heads, head_dim]; TE-PyTorch's default is sbhd),
  /// sbhd ([seqlen, batch, heads, head_dim]) or thd (packed sequences [tokens, heads, head_dim],
  /// with AttentionArgs' cu_seqlens_q/kv; a padding mask type, no mask tensor; on a mesh the heads
  /// may be sharded, the tokens not). The output has q's format. Within MultiHeadAttentionOptions
  /// bshd (x [batch, seqlen, hidden]) or thd (x [tokens, hidden] or [1, tokens, hidden], RoPE
  /// restarting at each sequence; self attention only).
  TORCH_ARG(TeChoice<QkvFormat>, qkv_format) = QkvFormat::kBshd;
  /// Context parallelism (TE's cp_comm_type: p2p, all_gather or a2a; te/nn/context_parallel.h):
  /// when set, q, k and v arrive with their sequence split over one mesh axis (the rules' or
  /// MeshResource's for "seqlen_cp", within MultiHeadAttention) and attention runs over the
  /// whole sequence without gathering it, each rank keeping its contiguous chunk (torch.chunk's,
  /// a DTensor's Shard); unset, a split sequence is gathered first. A te::Error names a sequence
  /// split over no axis, or over several, while it is set. bshd and sbhd; thd in TE's layout
  /// (te/nn/context_parallel.h: the tokens given in every rank's order).
  TORCH_ARG(std::optional<TeChoice<CpCommType>>, cp_comm_type) = std::nullopt;
  /// With cp_comm_type, bshd / sbhd: the sequence dim holds the tokens in TE's load-balanced
  /// order (rank r's chunks r and 2·cp-1-r of 2·cp, concatenated in rank order:
  /// functional::cp_rank_order; cp_unshard puts an output back), so that under a causal mask
  /// every rank of the ring has the same work; a padding mask stays in the sequence's own order,
  /// and MultiHeadAttention's RoPE rotates each token by its own position (a decoder's cross
  /// attention, which takes no cp, sees its queries in the order given: a memory mask over the
  /// keys only, [batch, 1, 1, seqlen_kv], is the same in either order). Ops outside attention
  /// that draw (hidden dropout) draw at a token's place in the tensor given. false: contiguous
  /// chunks, the tokens in their own order. A te::Error without cp_comm_type.
  TORCH_ARG(bool, cp_load_balanced) = false;
};

/// softmax(q k^T * scale + mask) v per head, with TE's masks (functional::MaskSpec). `mask` (for
/// the padding types and arbitrary) is a bool tensor whose true entries are masked out: the
/// padding types' [batch, 1, seqlen_q, seqlen_kv] (1s broadcast), arbitrary's broadcastable to
/// [batch, heads, seqlen_q, seqlen_kv] (its heads shard with the heads). A query that sees no key
/// (a padded position) gets zero probabilities: a zero output and no gradient, as in TE. `args`
/// add a bias (AttentionArgs). The unfused path constrains the attention weights to (batch,
/// heads, None, None).
class DotProductAttentionImpl : public torch::nn::Cloneable<DotProductAttentionImpl>,
                                public ShardedModule {
 public:
  DotProductAttentionImpl(int64_t heads, int64_t head_dim)
      : DotProductAttentionImpl(DotProductAttentionOptions(heads, head_dim)) {}
  explicit DotProductAttentionImpl(const DotProductAttentionOptions& options);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  at::Tensor forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                     const at::Tensor& mask = {}, const AttentionArgs& args = {});
  DTensor forward(const DTensor& query, const DTensor& key, const DTensor& value,
                  const at::Tensor& mask = {}, const AttentionArgs& args = {});
  /// The backend forward(query, key, value, mask, args) would run now: "te_flash_cpu" (te's
  /// fused CPU kernel), SDPA's ("flash_attention", "cudnn_attention", "efficient_attention",
  /// "math"), or "unfused".
  std::string fused_backend(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const at::Tensor& mask = {}, const AttentionArgs& args = {}) const;

  DotProductAttentionOptions options;
  /// The mask semantics the options resolve to (set by reset(), which warns where TE warns).
  functional::MaskSpec mask_spec;
  /// softmax_type "learnable": the sink logits, [heads] (TE's softmax_offset); else undefined.
  at::Tensor softmax_offset;
};

/// `dpa(q, k, v)` / `dpa(q, k, v, mask)` on tensors or DTensors.
class DotProductAttention : public torch::nn::ModuleHolder<DotProductAttentionImpl> {
 public:
  using torch::nn::ModuleHolder<DotProductAttentionImpl>::ModuleHolder;
  using Impl = DotProductAttentionImpl;
  at::Tensor operator()(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& mask = {}, const AttentionArgs& args = {}) {
    return get()->forward(q, k, v, mask, args);
  }
  DTensor operator()(const DTensor& q, const DTensor& k, const DTensor& v,
                     const at::Tensor& mask = {}, const AttentionArgs& args = {}) {
    return get()->forward(q, k, v, mask, args);
  }
};

/// Options for MultiHeadAttention(hidden, heads).
///
/// Example (Llama's attention: GQA, no biases, RMSNorm in front):
///   auto o = te::nn::MultiHeadAttentionOptions(512, 8);
///   o.attention().num_gqa_groups(2).attn_mask_type(te::nn::AttnMaskType::kPaddingCausal);
///   o.layernorm().layernorm_type("rmsnorm");
struct MultiHeadAttentionOptions {
  MultiHeadAttentionOptions(int64_t hidden_size, int64_t num_attention_heads)
      : hidden_size_(hidden_size), attention_(num_attention_heads, 0), layernorm_(hidden_size) {}
  TORCH_ARG(int64_t, hidden_size);
  /// The core attention's options (its module `attention`): the heads, head_dim (0:
  /// hidden_size / heads), num_gqa_groups, the mask, window, dropout, softmax ("learnable": the
  /// parameter attention.softmax_offset), fused and qkv_format; scale_factor 0 follows
  /// scale_attn_logits below; head_dim_v stays 0 (DotProductAttention's only).
  TORCH_ARG(DotProductAttentionOptions, attention);
  /// Normalise the input first (pre-LN); the norm's options.
  TORCH_ARG(bool, input_layernorm) = true;
  TORCH_ARG(LayerNormOptions, layernorm);
  /// One (hidden, 3, heads * head_dim) projection for self attention; otherwise Q and KV apart.
  TORCH_ARG(bool, fuse_qkv) = true;
  /// Self attention (forward(x)); false: cross attention (forward(x, memory)), which projects
  /// queries and keys/values with separate kernels.
  TORCH_ARG(bool, self_attention) = true;
  /// Biases on every projection (TE's use_bias / bias).
  TORCH_ARG(bool, use_bias) = false;
  /// Biases on the query, key and value projections only (nullopt: as use_bias): Qwen2's
  /// attention, Megatron's add_qkv_bias.
  TORCH_ARG(std::optional<bool>, qkv_bias) = std::nullopt;
  /// Logical axes of the kernels: fused (hidden, 3, heads*head_dim); separate query
  /// (hidden, heads*head_dim) and key/value (hidden, 2, kv_heads*head_dim); output
  /// (heads*head_dim, hidden). Biases take the kernels' output axes.
  TORCH_ARG(LogicalAxes, qkv_kernel_axes) = axis::joined_in_kernel();
  TORCH_ARG(LogicalAxes, q_kernel_axes) = axis::in_kernel();
  TORCH_ARG(LogicalAxes, kv_kernel_axes) = axis::joined_in_kernel();
  TORCH_ARG(LogicalAxes, out_kernel_axes) = axis::out_kernel();
  /// Initialise the query kernel divided by sqrt(head_dim) ...
  TORCH_ARG(bool, scaled_query_init) = true;
  /// ... and leave the logits unscaled, as TE does by default.
  TORCH_ARG(bool, scale_attn_logits) = false;
  /// Sequence parallel: activations outside the attention are sharded on seqlen (seqlen_tp).
  TORCH_ARG(bool, enable_sequence_parallel) = false;
  /// TE's qk_norm_type: normalise each query and key head over head_dim, RMSNorm or LayerNorm
  /// (modules q_norm and k_norm, a scale of head_dim each, shared by the heads) or
  /// L2Normalization (x / sqrt(sum x^2 + eps), no parameters); none by default. After RoPE unless
  /// qk_norm_before_rope (multi_head_attention.py L1130-1192 at d0067d0da).
  TORCH_ARG(TeChoice<QkNormType>, qk_norm_type) = QkNormType::kNone;
  TORCH_ARG(double, qk_norm_eps) = 1e-6;
  /// The RMSNorm / LayerNorm q/k norms learn gamma - 1 and scale by 1 + scale
  /// (LayerNormOptions::zero_centered_gamma): Gemma 3's q_norm and k_norm (transformers 5.23.0
  /// models/gemma3/modeling_gemma3.py Gemma3RMSNorm).
  TORCH_ARG(bool, qk_norm_zero_centered_gamma) = false;
  TORCH_ARG(bool, qk_norm_before_rope) = false;
  /// The RMSNorm / LayerNorm q/k norms take each token's query over all its heads at once (a
  /// scale of heads x head_dim; the key's of kv heads x head_dim) instead of each head over
  /// head_dim: OLMoE's and OLMo 2's full-width q_norm and k_norm (transformers 5.23.0
  /// models/olmoe/modeling_olmoe.py OlmoeAttention). Not TE's. With heads split over a mesh the
  /// query and key are gathered for the norm (an all-gather of each per layer), then split again.
  TORCH_ARG(bool, qk_norm_over_heads) = false;
  /// > 0: the query, key and value clamped to [-clip_qkv, clip_qkv] after the projections (and
  /// the q/k norms when qk_norm_before_rope), before RoPE: OLMo's and OLMoE's clip_qkv. 0: none.
  TORCH_ARG(double, clip_qkv) = 0.0;
  /// The rotary_pos_emb given to forward (AttentionArgs) rotates interleaved pairs (GPT-J) instead
  /// of halves (Llama); TE's rotary_pos_interleaved. Make the frequencies with the same choice
  /// (RotaryPositionEmbeddingOptions::interleaved).
  TORCH_ARG(bool, rotary_pos_interleaved) = false;
};

/// Self or cross attention with TE's kernel axes (w_fsdp, w_joined, w_tp) and activation axes
/// (batch, seqlen / seqlen_tp, heads, hidden). forward(x) is self attention;
/// forward(x, memory) attends from x to memory.
class MultiHeadAttentionImpl : public torch::nn::Cloneable<MultiHeadAttentionImpl>,
                               public ShardedModule {
 public:
  MultiHeadAttentionImpl(int64_t hidden_size, int64_t heads)
      : MultiHeadAttentionImpl(MultiHeadAttentionOptions(hidden_size, heads)) {}
  explicit MultiHeadAttentionImpl(const MultiHeadAttentionOptions& options);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// `mask`: the attention's mask (DotProductAttention's); `args`: its bias and the RoPE
  /// frequencies (AttentionArgs).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& memory = {},
                     const at::Tensor& mask = {}, const AttentionArgs& args = {});
  DTensor forward(const DTensor& x, const std::optional<DTensor>& memory = std::nullopt,
                  const at::Tensor& mask = {}, const AttentionArgs& args = {});
  /// The output and the input norm's output (TE's return_layernorm_output: the residual of a
  /// layer with apply_residual_connection_post_layernorm); x itself without input_layernorm.
  std::pair<at::Tensor, at::Tensor> forward_with_layernorm_output(const at::Tensor& x,
                                                                  const at::Tensor& memory = {},
                                                                  const at::Tensor& mask = {},
                                                                  const AttentionArgs& args = {});
  std::pair<DTensor, DTensor> forward_with_layernorm_output(
      const DTensor& x, const std::optional<DTensor>& memory = std::nullopt,
      const at::Tensor& mask = {}, const AttentionArgs& args = {});
  std::vector<Fp8Gemm> fp8_gemms() override;

  MultiHeadAttentionOptions options;
  LayerNorm layernorm{nullptr};
  /// qk_norm_type RMSNorm or LayerNorm: the query and key norms (else null).
  LayerNorm q_norm{nullptr}, k_norm{nullptr};
  DotProductAttention attention{nullptr};
  at::Tensor qkv_kernel, qkv_bias;                  // fused
  at::Tensor q_kernel, q_bias, kv_kernel, kv_bias;  // separate
  at::Tensor out_kernel, out_bias;
  /// FP8 state of the projections (buffers qkv_fp8_*, q_fp8_*, kv_fp8_*, out_fp8_*).
  std::shared_ptr<fp8::GemmMeta> qkv_fp8, q_fp8, kv_fp8, out_fp8;

  int64_t head_dim() const;
  int64_t kv_heads() const;

 protected:
  void forget_member(const std::string& name) override;

 private:
  void register_projections();  // reset's kernels and biases
};

/// `mha(x)` and `mha(x, memory, mask)`: self or cross attention.
class MultiHeadAttention : public torch::nn::ModuleHolder<MultiHeadAttentionImpl> {
 public:
  using torch::nn::ModuleHolder<MultiHeadAttentionImpl>::ModuleHolder;
  using Impl = MultiHeadAttentionImpl;
  at::Tensor operator()(const at::Tensor& x, const at::Tensor& memory = {},
                        const at::Tensor& mask = {}, const AttentionArgs& args = {}) {
    return get()->forward(x, memory, mask, args);
  }
  DTensor operator()(const DTensor& x, const std::optional<DTensor>& memory = std::nullopt,
                     const at::Tensor& mask = {}, const AttentionArgs& args = {}) {
    return get()->forward(x, memory, mask, args);
  }
};

}  // namespace te::nn
