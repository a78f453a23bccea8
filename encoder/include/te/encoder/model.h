#pragma once

// The classifier of Transformer Engine's encoder example, as a te::nn module:
// Embedding(vocab, hidden) -> TransformerLayer (encoder, padding mask) -> flatten (B, S * hidden)
// -> Dense(hidden) -> Dense(hidden) -> Dense(2). The two wide Dense layers carry the custom
// logical axes of TE's model-parallel example (my_broadcast_axis, my_tp_axis), so rules that map
// my_tp_axis onto a mesh axis split them column- then row-parallel.

#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <optional>
#include <string>
#include <vector>

#include "te/nn.h"

namespace encoder {

struct EncoderOptions {
  int64_t vocab_size = 0;
  int64_t max_seq_len = 32;
  int64_t hidden_size = 256;
  int64_t mlp_hidden_size = 1024;
  int64_t num_attention_heads = 8;
  // TE's examples/jax/encoder at d0067d0da: hidden and attention dropout 0.1, and the
  // TransformerLayer defaults since 7a5859834 (2025-11-10): intermediate dropout 0 and {"gelu"}
  // (its model-parallel example sets {"gelu", "linear"}).
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  double intermediate_dropout = 0.0;
  std::vector<std::string> mlp_activations = {"gelu"};
  bool sequence_parallel = false;
  /// Context parallelism in the layer's attention (TE's cp_comm_type): its padding mask and
  /// dropout are taken as one process's (te/nn/context_parallel.h).
  std::optional<te::nn::CpCommType> cp_comm_type;
};

class EncoderClassifierImpl : public torch::nn::Cloneable<EncoderClassifierImpl> {
 public:
  explicit EncoderClassifierImpl(const EncoderOptions& options);
  void reset() override;
  void pretty_print(std::ostream& stream) const override;

  /// One process: ids [B, S] (int64), mask [B, 1, S, S] (true = masked) -> logits [B, 2].
  at::Tensor forward(const at::Tensor& ids, const at::Tensor& mask);
  /// On the current mesh: the global batch (the same on every rank); each rank embeds only its
  /// batch rows (under the rules in scope) and the logits come back as a DTensor.
  te::DTensor forward_on_mesh(const at::Tensor& ids, const at::Tensor& mask);

  /// Serving: holds the embedding table as E4M3 codes and a scale (buffers embedding_fp8 and
  /// embedding_fp8_scale_inv; rows are decoded as they are looked up) and releases the fp32
  /// table. With `empty`, lays the buffers out for a checkpoint saved after this call.
  void freeze_fp8_embedding(bool empty = false);

  EncoderOptions options;
  at::Tensor embedding;                               // [vocab, hidden], replicated
  at::Tensor embedding_fp8, embedding_fp8_scale_inv;  // after freeze_fp8_embedding
  te::nn::TransformerLayer layer{nullptr};
  te::nn::Dense dense_1{nullptr}, dense_2{nullptr}, head{nullptr};

 private:
  /// The head on dense_2's output: in high precision inside an enabled Fp8Autocast, as TE's
  /// (Flax's nn.Dense) is.
  template <typename T>
  T head_forward(const T& x);
};
TORCH_MODULE(EncoderClassifier);

}  // namespace encoder
