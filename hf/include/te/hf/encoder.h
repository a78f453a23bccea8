#pragma once

// te::hf::Encoder: a BERT-family text encoder (BERT, MiniLM and the sentence-transformers models
// built on them) made of te::nn modules with logical axes, so it runs on one process or sharded
// over any mesh the rules in scope describe; load_encoder: a Hugging Face checkpoint loaded into
// it (each rank reads only its slices' bytes); and the sentence-embedding poolings.
//
// Example (sentence embeddings as sentence-transformers' all-MiniLM-L6-v2 gives them):
//   te::hf::Encoder model = te::hf::load_encoder("all-MiniLM-L6-v2/");
//   at::Tensor hidden = model->forward(ids, attention_mask);         // [batch, seq, hidden]
//   at::Tensor emb = te::hf::l2_normalize(te::hf::mean_pool(hidden, attention_mask));

#include <torch/nn/cloneable.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <optional>
#include <string>
#include <string_view>

#include "te/hf/weights.h"
#include "te/nn/dense.h"
#include "te/nn/embedding.h"
#include "te/nn/sharded.h"
#include "te/nn/transformer.h"

namespace te::hf {

/// A BERT encoder's config.json (model_type "bert"): post-LayerNorm layers with biases, learned
/// absolute positions, token types, an optional pooler. Missing fields take transformers'
/// BertConfig defaults; a field te-cpp does not honour is a te::Error naming it.
struct EncoderConfig {
  std::string model_type = "bert";
  int64_t vocab_size = 30522;
  int64_t hidden_size = 768;
  int64_t num_hidden_layers = 12;
  int64_t num_attention_heads = 12;
  int64_t intermediate_size = 3072;
  int64_t max_position_embeddings = 512;
  int64_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  /// The word table's padding row (pad_token_id): its gradient is zero, as transformers'
  /// nn.Embedding(padding_idx=pad_token_id) trains it. nullopt: none.
  std::optional<int64_t> pad_token_id = 0;
  /// The MLP's activation as te::nn names it: transformers' "gelu" is "gelu_exact", its
  /// "gelu_new" / "gelu_pytorch_tanh" is "gelu" (tanh form); "relu", "silu".
  std::string activation = "gelu_exact";
  double hidden_dropout = 0.1;     ///< hidden_dropout_prob (training only)
  double attention_dropout = 0.1;  ///< attention_probs_dropout_prob (training only)
  /// BertModel's pooler (tanh(W h[CLS] + b)); load_encoder sets it from the checkpoint.
  bool pooler = true;
  std::string dtype;
};

/// Checks sizes (positive, at most 2^24), heads dividing hidden_size, a positive finite epsilon
/// and dropouts in [0, 1). te::Error naming the field (`where`: its source) otherwise.
void check_encoder_config(const EncoderConfig& config, const std::string& where);
/// Parses config.json's text (`path` names it in errors); te::Error naming the field for a
/// wrong type, an unknown model_type or architecture, or a field or value te-cpp does not honour.
EncoderConfig parse_encoder_config(std::string_view json_text, const std::string& path);
/// Reads `dir`/config.json (or `dir` itself when it names a file).
EncoderConfig read_encoder_config(const std::string& dir);

/// The logical axis of the position table's rows: no rule names it, so the table is never
/// sharded by rows (every rank looks its positions up locally).
inline constexpr const char* kPositionAxis = "position";

/// ids -> hidden states: word + position + token-type embeddings, LayerNorm, then BERT's
/// post-LN layers (TE's TransformerLayer with output_layernorm and
/// apply_residual_connection_post_layernorm), keys masked where attention_mask is 0.
class EncoderImpl : public torch::nn::Cloneable<EncoderImpl> {
 public:
  explicit EncoderImpl(const EncoderConfig& config);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// ids [batch, seq] (int64) -> [batch, seq, hidden]. attention_mask [batch, seq] (1: a token,
  /// 0: padding; undefined: all tokens), token_type_ids [batch, seq] (undefined: all 0).
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& attention_mask = {},
                     const at::Tensor& token_type_ids = {});
  /// On a mesh: ids laid out as (batch, seqlen); the masks are the whole [batch, seq] tensors.
  DTensor forward(const DTensor& ids, const at::Tensor& attention_mask = {},
                  const at::Tensor& token_type_ids = {});
  /// The same ids on every rank: laid out by the rules' batch and seqlen axes, then forward.
  DTensor forward_on_mesh(const at::Tensor& ids, const at::Tensor& attention_mask = {},
                          const at::Tensor& token_type_ids = {});
  /// BertModel's pooler_output: tanh(dense(hidden[:, 0])) -> [batch, hidden].
  at::Tensor pool(const at::Tensor& hidden);
  DTensor pool(const DTensor& hidden);

  EncoderConfig config;
  te::nn::Embedding word{nullptr}, position{nullptr}, token_type{nullptr};
  te::nn::LayerNorm embed_norm{nullptr};
  torch::nn::ModuleList layers{nullptr};
  te::nn::Dense pooler{nullptr};  ///< null without a pooler
};
TE_MODULE(Encoder);

/// The te::nn layer options a BERT config implies.
te::nn::TransformerLayerOptions encoder_layer_options(const EncoderConfig& config);

/// Sentence embeddings from hidden states [batch, seq, hidden]: the mean over the tokens whose
/// attention_mask is 1 (sentence-transformers' mean pooling; undefined mask: every token), the
/// first ([CLS]) token's state, and x / max(||x||, 1e-12) along the last dim.
at::Tensor mean_pool(const at::Tensor& hidden, const at::Tensor& attention_mask);
at::Tensor cls_pool(const at::Tensor& hidden);
at::Tensor l2_normalize(const at::Tensor& x);

/// The te parameter name -> the checkpoint's tensors, for an Encoder of `config` whose tensor
/// names start with `prefix` (BertModel's: ""; BertFor*'s: "bert.").
WeightMap encoder_weight_map(const EncoderConfig& config, const std::string& prefix = "");

/// Builds the Encoder `dir`/config.json describes under the mesh and rules in scope and loads
/// `dir`'s safetensors weights into it, each rank reading only its slices' bytes; the pooler is
/// built when the checkpoint holds one. te::Error naming the file and tensor for a missing or
/// extra tensor (strict), a shape that differs from the config's, a damaged file. The model is
/// returned in eval mode, as from_pretrained returns it (train() turns its dropout on).
Encoder load_encoder(const std::string& dir, const LoadOptions& options = {});

}  // namespace te::hf
