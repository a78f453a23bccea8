#pragma once

// te::nn::InferenceParams: the key/value cache of incremental decoding, with Transformer Engine's
// InferenceParams semantics (transformer_engine/pytorch/attention/inference.py at d0067d0da):
// sequences named by ids, a step that says how many new tokens each brings (pre_step), and per
// layer a step(k, v) that stores the new keys and values and returns every cached one, which the
// attention reads with the bottom-right causal mask. Two layouts: contiguous (a slot of
// max_sequence_length tokens per sequence, TE's NonPagedKVCacheManager) and paged (a shared pool
// of pages of page_size tokens, each sequence holding a page table, TE's PagedKVCacheManager:
// pages are taken as a sequence grows and returned when it ends).
//
// Where te differs from TE, on purpose:
//   - a step keeps the order the caller gives (TE puts continuing sequences first, then new ones
//     in set order) and a continuing sequence may bring any number of tokens (TE advances every
//     continuing sequence by one: inference.py L498-500), so prompts can be prefilled in chunks
//     beside decoding sequences;
//   - a step that does not fit (too many sequences, a sequence past max_sequence_length, not
//     enough free pages) is a te::Error naming it, and the cache is left as it was.
// As in TE, a sequence absent from a step has ended: its slot or pages are freed by that step.
//
// On a mesh the cache holds what its rank's attention computes with: the key/value heads of its
// shard (tensor parallel shards the cache with the heads), so no rank holds the whole cache.
//
// Example (see te::hf::CausalLM::step and te::gen::generate):
//   te::nn::InferenceParams cache(te::nn::InferenceParamsOptions(8, 2048, kv_heads, head_dim)
//                                     .is_paged(true).page_size(16).total_num_pages(512));
//   cache.pre_step({{7, prompt_len}});  // prefill sequence 7
//   logits = model->step(prompt_ids, cache);
//   cache.pre_step({{7, 1}, {9, other_len}});  // decode 7, prefill 9

#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <cstdint>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace te::nn {

/// TE's InferenceParams arguments (inference.py L129-142).
struct InferenceParamsOptions {
  InferenceParamsOptions(int64_t max_batch_size, int64_t max_sequence_length, int64_t num_heads_kv,
                         int64_t head_dim_k)
      : max_batch_size_(max_batch_size),
        max_sequence_length_(max_sequence_length),
        num_heads_kv_(num_heads_kv),
        head_dim_k_(head_dim_k) {}
  /// Sequences in one step at most.
  TORCH_ARG(int64_t, max_batch_size);
  /// Tokens of one sequence at most (prompt and generated).
  TORCH_ARG(int64_t, max_sequence_length);
  /// Key/value heads of the whole model (its GQA groups); a tensor-parallel rank holds its share.
  TORCH_ARG(int64_t, num_heads_kv);
  TORCH_ARG(int64_t, head_dim_k);
  /// 0: head_dim_k.
  TORCH_ARG(int64_t, head_dim_v) = 0;
  /// The cached keys and values are stored in this dtype (the attention reads them back in
  /// the query's).
  TORCH_ARG(at::ScalarType, dtype) = at::kFloat;
  /// A pool of total_num_pages pages of page_size tokens shared by the sequences; otherwise a
  /// slot of max_sequence_length tokens per sequence, max_batch_size slots.
  TORCH_ARG(bool, is_paged) = false;
  TORCH_ARG(int64_t, page_size) = 0;
  TORCH_ARG(int64_t, total_num_pages) = 0;
};

/// One owner at a time: a generation loop (or a server's scheduler) drives it step by step.
class InferenceParams {
 public:
  explicit InferenceParams(const InferenceParamsOptions& options);

  /// Starts a step: `step` lists (sequence id, new tokens) in the order their tokens are packed
  /// in the model's input. An id not seen before starts a sequence; a known one continues; a
  /// known id absent from `step` has ended and its memory is freed. Every new-token count is
  /// >= 1. te::Error (cache unchanged) for a repeated id, more than max_batch_size sequences, a
  /// sequence that would pass max_sequence_length, or too few free pages.
  void pre_step(const std::vector<std::pair<int64_t, int64_t>>& step);

  /// Stores layer `layer`'s new keys and values, packed [new tokens, kv heads, head dim] in the
  /// step's order (the kv heads being this rank's share), and returns every cached key and value
  /// of the step's sequences in TE's cache format bshd (inference.py L198): [batch,
  /// max_seqlen_kv, kv heads, head dim], sequence i's first seqlen_i rows holding its tokens and
  /// the rest zeros (padding_mask() hides them), in `k`'s dtype. The first step of a layer
  /// allocates its memory. No gradient flows into the cache. A layer stepped twice in one step is
  /// a te::Error (two layers sharing a layer number would overwrite each other).
  std::pair<at::Tensor, at::Tensor> step(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  /// step() in two parts: store the new keys and values (the same checks), and layer `layer`'s
  /// pools [rows, kv heads, head dim] (keys, values), which kv_rows() indexes: what
  /// functional::paged_attention reads without gathering.
  void store(int64_t layer, const at::Tensor& k, const at::Tensor& v);
  std::pair<at::Tensor, at::Tensor> pools(int64_t layer) const;

  /// Ends sequence `id` now, between steps: its slot or pages are free for the next step (which
  /// must not list it again as continuing; as a new sequence it starts empty). Unknown ids are
  /// ignored. (TE frees a sequence only when a step omits it.)
  void end(int64_t id);

  /// Frees every sequence (TE's reset).
  void reset();

  // ---- the current step (after pre_step) ----
  const std::vector<int64_t>& sequence_ids() const { return ids_; }
  int64_t batch_size() const { return static_cast<int64_t>(ids_.size()); }
  /// [batch + 1] int64: where each sequence's new tokens are in the packed input.
  const at::Tensor& cu_seqlens_q() const { return cu_q_; }
  /// [batch + 1] int64: where each sequence's cached tokens are in step()'s output.
  const at::Tensor& cu_seqlens_kv() const { return cu_kv_; }
  /// [batch] int64: each sequence's length before this step (its new tokens' first position:
  /// RoPE's start_positions; TE's get_seqlens_pre_step).
  const at::Tensor& pre_step_seqlens() const { return pre_; }
  /// [batch, 1, max_seqlen_q, max_seqlen_kv] bool, true where a query or key is padding: the
  /// new tokens padded to [batch, max_seqlen_q] and step()'s keys, for a padding mask type.
  const at::Tensor& padding_mask() const { return padding_mask_; }
  /// [new tokens] int64: where each packed new token is in [batch * max_seqlen_q] (its sequence
  /// times max_seqlen_q plus its place among the sequence's new tokens).
  const at::Tensor& query_rows() const { return query_rows_; }
  /// [batch, max_seqlen_kv] int64: the pool row of each sequence's cached tokens (padding: a
  /// row of zeros).
  at::Tensor kv_rows() const { return read_rows_.view({batch_size(), max_kv_}); }
  /// [batch] int64: each sequence's length after this step (its cached tokens).
  const at::Tensor& seqlens_kv() const { return seqlens_kv_; }
  int64_t max_seqlen_q() const { return max_q_; }
  int64_t max_seqlen_kv() const { return max_kv_; }
  int64_t new_tokens() const { return new_tokens_; }

  // ---- memory ----
  const InferenceParamsOptions& options() const { return options_; }
  /// Tokens a sequence's memory is counted in: page_size (paged) or max_sequence_length.
  int64_t block_tokens() const;
  /// Pages (or slots, contiguous) in all, free, and the ones `tokens` tokens take.
  int64_t total_blocks() const;
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t blocks_for(int64_t tokens) const;
  /// The length of sequence `id` (0 when unknown).
  int64_t seqlen(int64_t id) const;
  /// Bytes the allocated layers hold on this rank.
  int64_t allocated_bytes() const;

 private:
  struct Sequence {
    int64_t length = 0;
    std::vector<int64_t> blocks;  // pages, or the one slot
  };
  // pre_step's parts: the step checked against the cache (nothing changes when it throws), and
  // the padded geometry of the step from each sequence's pool rows.
  void check_step(const std::vector<std::pair<int64_t, int64_t>>& step) const;
  void lay_out_step(const std::vector<std::vector<int64_t>>& rows);
  InferenceParamsOptions options_;
  std::map<int64_t, Sequence> sequences_;
  std::vector<int64_t> free_;  // free pages or slots, taken from the back
  std::vector<int64_t> ids_;
  at::Tensor cu_q_, cu_kv_, pre_;
  at::Tensor padding_mask_, query_rows_, seqlens_kv_;
  // Rows of the flat [blocks * block_tokens + 1] pool: where the new tokens go, and where step()'s
  // [batch, max_seqlen_kv] keys come from (padding: the last row, never written, zeros).
  at::Tensor write_rows_, read_rows_;
  int64_t max_q_ = 0, max_kv_ = 0, new_tokens_ = 0;
  std::map<int64_t, std::pair<at::Tensor, at::Tensor>> layers_;  // layer -> flat k, v pools
  std::set<int64_t> stepped_;                                    // layers stepped since pre_step
};

}  // namespace te::nn
