#pragma once

// te::hf::CausalLM: a Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, Gemma) built from te::nn
// modules with logical axes, so it runs on one process or sharded over any mesh the rules in
// scope describe, and load_causal_lm: a Hugging Face checkpoint (config.json and
// model.safetensors, or a sharded set) loaded into it, each rank reading only the bytes of its
// own slices.
//
// Example (tensor parallel over two thread ranks; see README "Use a Hugging Face model"):
//   te::run_local_ranks(2, [](int) {
//     te::DeviceMesh mesh({2}, {"model"});
//     te::MeshScope on(mesh);
//     te::MeshResourceScope tp(te::parse_mesh_resource("tp=model"));
//     te::AxisRulesScope rules(te::extend_logical_axis_rules(te::parse_axis_rules("vocab=model")));
//     te::hf::CausalLM model = te::hf::load_causal_lm("SmolLM2-135M/");
//     te::DTensor logits = model->forward_on_mesh(ids);  // vocab-sharded [batch, seq, vocab]
//   });

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <map>
#include <string>
#include <vector>

#include "te/gen/model.h"
#include "te/hf/config.h"
#include "te/hf/weights.h"
#include "te/nn/dense.h"
#include "te/nn/embedding.h"
#include "te/nn/kv_cache.h"
#include "te/nn/moe_layer.h"
#include "te/nn/rope.h"
#include "te/nn/sharded.h"
#include "te/nn/transformer.h"

namespace te::hf {

/// The te::nn layer options a config implies for layer `layer` (its sliding window).
te::nn::TransformerLayerOptions layer_options(const CausalLMConfig& config, int64_t layer);

/// Token ids -> logits: embed (times config.embedding_multiplier), the layers with RoPE (the
/// sliding layers' own where config.sliding_rope_theta is set), the final RMSNorm, the head (the
/// embedding table itself when tied; soft-capped by config.final_logit_softcapping). Built under
/// the mesh and rules in scope, like every te::nn module; initialised at random (load_causal_lm
/// fills it). The language model a te::gen::Engine drives (te::gen::Engine engine(causal_lm)).
class CausalLMImpl : public torch::nn::Cloneable<CausalLMImpl>, public te::gen::LanguageModel {
 public:
  explicit CausalLMImpl(const CausalLMConfig& config);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// ids [batch, seq] (int64) -> logits [batch, seq, vocab], positions 0..seq-1.
  at::Tensor forward(const at::Tensor& ids);
  /// On a mesh: ids laid out as (batch, seqlen); logits stay sharded over the vocabulary. With
  /// config.cp_load_balanced (and a cp axis), the ids' sequence dim is in the load-balanced cp
  /// order (functional::cp_rank_order), and so are the logits' and the learned positions.
  DTensor forward(const DTensor& ids);
  /// The same ids on every rank: laid out by the rules' batch and seqlen axes, then forward (in
  /// the order forward(DTensor) says).
  DTensor forward_on_mesh(const at::Tensor& ids);
  /// A model built with config.packed_sequences: ids [1, tokens] holding sequences packed back to
  /// back (TE's THD), sequence i tokens cu_seqlens[i] ... cu_seqlens[i + 1] - 1 (integer
  /// [sequences + 1] from 0 to tokens) -> logits [1, tokens, vocab]: each sequence attends within
  /// itself only and its positions start at 0, as if run alone. Or rows of packed sequences:
  /// ids [rows, tokens] with cu_seqlens [rows, sequences + 1], each row packed alone (a row with
  /// fewer sequences repeats its last entry; its tokens after the last sequence are padding)
  /// -> logits [rows, tokens, vocab]. On a mesh a row's tokens stay whole on its rank: the rows
  /// may be split (the rules' batch axes: data parallel, FSDP), the heads too, and the tokens
  /// over the cp axes when config.cp_comm_type is set: then each row's tokens are in TE's thd
  /// layout in rank order (functional::cp_rank_order_packed by its slots).
  /// `cu_seqlens_padded` (optional, the shape of cu_seqlens): each sequence's slot, its valid
  /// tokens first and padding after (TE's cu_seqlens_padded; context parallelism needs slots
  /// of a multiple of 2·cp); positions count on through a slot's padding.
  at::Tensor forward_packed(const at::Tensor& ids, const at::Tensor& cu_seqlens,
                            const at::Tensor& cu_seqlens_padded = {});
  DTensor forward_packed(const DTensor& ids, const at::Tensor& cu_seqlens,
                         const at::Tensor& cu_seqlens_padded = {});
  /// One step of incremental decoding (eval mode): `ids` are the step's new tokens packed
  /// [tokens] in the order of `cache`'s pre_step (a prompt, a chunk of one, or one generated
  /// token per sequence); returns the logits of each sequence's last new token, [batch, vocab].
  /// The cache is an InferenceParams for this model (cache_options). LongRoPE (Phi-3's long
  /// context) rotates a step by its longest sequence, as transformers' forward does; a step whose
  /// sequences lie on both sides of rope_original_max_position_embeddings, or that takes a
  /// sequence past it with keys cached under the short factors (transformers' generate
  /// recomputes those there), is a te::Error.
  at::Tensor step(const at::Tensor& ids, te::nn::InferenceParams& cache) override;
  /// On the mesh in scope: the same ids on every rank; each rank caches its key/value heads and
  /// the logits stay sharded over the vocabulary, [batch, vocab].
  DTensor step_on_mesh(const at::Tensor& ids, te::nn::InferenceParams& cache) override;

  // te::gen::LanguageModel's numbers, from the config (causal_lm_generation.cpp).
  int64_t vocab_size() const override;
  /// max_position_embeddings; with LongRoPE at most rope_original_max_position_embeddings, the
  /// length a te::gen::Engine generates within (see step).
  int64_t max_positions() const override;
  te::nn::InferenceParamsOptions kv_cache_options(int64_t max_batch,
                                                  int64_t max_length) const override;
  int64_t kv_bytes_per_token(at::ScalarType dtype) const override;
  const torch::nn::Module& as_module() const override { return *this; }

  CausalLMConfig config;
  te::nn::Embedding embed{nullptr};
  te::nn::Embedding position{nullptr};  ///< learned positions (GPT-2), or null
  torch::nn::ModuleList layers{nullptr};
  te::nn::LayerNorm norm{nullptr};
  te::nn::Dense lm_head{nullptr};                 ///< null when tie_word_embeddings
  te::nn::RotaryPositionEmbedding rope{nullptr};  ///< null with learned positions
  /// The sliding-window layers' own RoPE (config.sliding_rope_theta: Gemma 3's), else null.
  te::nn::RotaryPositionEmbedding sliding_rope{nullptr};
};
TE_MODULE(CausalLM);

/// Rows of tokens [rows, tokens] (ids, labels, positions) in the order a model of `config` takes
/// them on the mesh in scope, where context parallelism splits them: packed rows (`slots`, each
/// row's cu_seqlens_padded, or cu_seqlens without padding, [rows, sequences + 1]) in TE's thd
/// layout, whole rows in the load-balanced order (config.cp_load_balanced) or as they are. The
/// rows themselves without config.cp_comm_type or a cp axis.
at::Tensor cp_token_order(const CausalLMConfig& config, const at::Tensor& rows,
                          const at::Tensor& slots = {});

/// The router term transformers adds to a mixture of experts' training loss when
/// config.output_router_logits (MoeCausalLMOutputWithPast's loss: the cross-entropy plus
/// router_aux_loss_coef times load_balancing_loss_func over every sparse layer's router logits):
/// router_aux_loss_coef · te::nn::load_balancing_loss(loads), `loads` from a
/// te::nn::RouterLoadScope open around the forward. A zero scalar when output_router_logits is
/// false; te::Error when it is true and `loads` holds no layer's (a forward outside the scope).
///
/// Example:
///   te::nn::RouterLoadScope loads;
///   at::Tensor logits = model->forward(ids);
///   at::Tensor loss = next_token_loss(logits, ids) + router_aux_loss(model->config,
///   loads.loads());
at::Tensor router_aux_loss(const CausalLMConfig& config,
                           const std::vector<te::nn::RouterLoad>& loads);

/// The InferenceParams options of a KV cache for a model of `config` (its key/value heads and
/// head dim); max_sequence_length 0: the config's max_position_embeddings. Set is_paged,
/// page_size and total_num_pages on the result for a paged cache.
te::nn::InferenceParamsOptions cache_options(const CausalLMConfig& config, int64_t max_batch_size,
                                             int64_t max_sequence_length = 0);

/// The te parameter name -> sources, for every parameter a CausalLM of `config` has.
WeightMap causal_lm_weight_map(const CausalLMConfig& config);

/// Whole te tensors (parameters, or their gradients) by te name -> the checkpoint's tensors by
/// its names (the inverse of the weight map): for comparing with, or saving as, Hugging Face.
std::map<std::string, at::Tensor> to_hf_tensors(const CausalLMConfig& config,
                                                const std::map<std::string, at::Tensor>& te_whole);

/// Builds the CausalLM `dir`/config.json describes under the mesh and rules in scope and loads
/// `dir`'s safetensors weights into it: each rank reads only the byte ranges of its own slices.
/// te::Error naming the file and tensor for a missing or extra tensor (strict), a shape that
/// differs from the config's, a dtype LibTorch cannot hold, a damaged file. The model is returned
/// in eval mode, as from_pretrained returns it (train() turns its dropout on).
CausalLM load_causal_lm(const std::string& dir, const LoadOptions& options = {});

}  // namespace te::hf
