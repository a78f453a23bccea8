#pragma once

// te::nn::Embedding: a lookup table whose dims carry logical axes (Flax's nn.Embed, "vocab" and
// "embed" by default), so under rules its rows shard over a mesh axis (vocabulary-parallel, as
// Megatron's VocabParallelEmbedding) or its columns do, and the same table serves as a tied
// output projection whose logits stay sharded over the vocabulary (attend).

#include <torch/arg.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <optional>

#include "te/nn/sharded.h"

namespace te::nn {

/// Options for Embedding(num_embeddings, features).
///
/// Example (vocabulary-parallel over "model", activations constrained after the lookup):
///   te::AxisRulesScope rules(te::parse_axis_rules("vocab=model,batch=data"));
///   te::nn::Embedding embed(te::nn::EmbeddingOptions(32000, 4096)
///                               .output_axes({"batch", "seqlen", "embed"}));
struct EmbeddingOptions {
  EmbeddingOptions(int64_t num_embeddings, int64_t features)
      : num_embeddings_(num_embeddings), features_(features) {}
  /// Rows of the table (the vocabulary size).
  TORCH_ARG(int64_t, num_embeddings);
  /// Columns of the table (the embedding size).
  TORCH_ARG(int64_t, features);
  /// Logical axes of the table (rows, columns).
  TORCH_ARG(LogicalAxes, embedding_axes) = LogicalAxes{axis::kVocab, axis::kEmbed};
  /// Constraint on the lookup's output (ids' dims then the embedding dim); empty: none. On a
  /// mesh, a vocabulary-parallel lookup's partial sums are reduced into this layout (one
  /// all-reduce, or a reduce-scatter for sequence-sharded activations); without it they stay
  /// Partial until the next constraint.
  TORCH_ARG(LogicalAxes, output_axes) = {};
  /// torch.nn.Embedding's padding_idx: this row's gradient is always zero (the lookup is
  /// unchanged), as Hugging Face models' pad_token_id row trains. nullopt: none.
  TORCH_ARG(std::optional<int64_t>, padding_idx) = std::nullopt;
};

/// Embedding lookup, table initialised as Flax's nn.Embed (normal, stddev 1/sqrt(features)) from
/// te::nn::manual_seed's generator.
class EmbeddingImpl : public torch::nn::Cloneable<EmbeddingImpl>, public ShardedModule {
 public:
  EmbeddingImpl(int64_t num_embeddings, int64_t features)
      : EmbeddingImpl(EmbeddingOptions(num_embeddings, features)) {}
  explicit EmbeddingImpl(const EmbeddingOptions& options);

  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// table[ids]: integer ids of any shape -> [ids' shape..., features]. An id outside
  /// [0, num_embeddings) is a te::Error naming it.
  at::Tensor forward(const at::Tensor& ids);
  DTensor forward(const DTensor& ids);
  /// x @ table^T over x's last dim (features): the logits of a tied output layer (Flax's
  /// Embed.attend). On a vocabulary-parallel table they stay sharded over the vocabulary.
  at::Tensor attend(const at::Tensor& x);
  DTensor attend(const DTensor& x);

  /// FP8 weights (called by te::nn::freeze_fp8_weights and prepare_fp8_weights): the table held
  /// as E4M3 codes with one scale per row (fp8::quantize_rows), registered as the buffers
  /// fp8_embedding [rows, features] and fp8_embedding_scale_inv [rows] (fp32), and the fp32
  /// table released: about a quarter of its bytes. forward then decodes only the rows it looks
  /// up; attend decodes the whole table for each call. Inference on one process, as FP8 GEMM
  /// kernels are. `empty`: zero codes, for load_checkpoint to fill. Returns false when the table
  /// is already held in FP8.
  bool freeze_fp8(bool empty = false);
  bool fp8_frozen() const { return fp8_embedding.defined(); }

  EmbeddingOptions options;
  at::Tensor embedding;
  at::Tensor fp8_embedding, fp8_embedding_scale_inv;  ///< after freeze_fp8

 protected:
  void forget_member(const std::string& name) override;
};
TE_MODULE(Embedding);

}  // namespace te::nn
