#include "te/encoder/model.h"

#include <ATen/ATen.h>

#include <cmath>

namespace encoder {

namespace F = te::nn::functional;

EncoderClassifierImpl::EncoderClassifierImpl(const EncoderOptions& options_) : options(options_) {
  reset();
}

void EncoderClassifierImpl::reset() {
  const int64_t h = options.hidden_size;
  TE_CHECK(options.vocab_size > 0, "EncoderClassifier: vocab_size must be positive");
  // Flax's nn.Embed default: variance_scaling(1, fan_in, normal) with fan_in = features.
  embedding = register_parameter(
      "embedding", te::nn::normal({options.vocab_size, h}, 1.0 / std::sqrt(double(h))));
  auto layer_options =
      te::nn::TransformerLayerOptions(h, options.mlp_hidden_size, options.num_attention_heads)
          .layer_type("encoder")
          .hidden_dropout(options.hidden_dropout)
          .intermediate_dropout(options.intermediate_dropout)
          .mlp_activations(options.mlp_activations);
  layer_options.self_attention().enable_sequence_parallel(options.sequence_parallel);
  layer_options.self_attention()
      .attention()
      .attn_mask_type(te::nn::AttnMaskType::kPadding)
      .attention_dropout(options.attention_dropout)
      .cp_comm_type(options.cp_comm_type);
  layer = register_module("layer", te::nn::TransformerLayer(layer_options));
  // TE's DenseGeneral defaults (variance_scaling(1, fan_in, truncated_normal) kernels, zero
  // biases); the head is Flax's nn.Dense (lecun_normal: the same distribution).
  dense_1 =
      register_module("dense_1", te::nn::Dense(te::nn::DenseOptions(options.max_seq_len * h, h)
                                                   .kernel_axes({"my_broadcast_axis", "my_tp_axis"})
                                                   .bias_axes({"my_tp_axis"})));
  dense_2 =
      register_module("dense_2", te::nn::Dense(te::nn::DenseOptions(h, h)
                                                   .kernel_axes({"my_tp_axis", "my_broadcast_axis"})
                                                   .bias_axes({"my_broadcast_axis"})));
  head = register_module("head", te::nn::Dense(te::nn::DenseOptions(h, 2)));
}

void EncoderClassifierImpl::pretty_print(std::ostream& stream) const {
  stream << "encoder::EncoderClassifier(vocab=" << options.vocab_size
         << ", seq=" << options.max_seq_len << ", hidden=" << options.hidden_size
         << ", mlp=" << options.mlp_hidden_size << ", heads=" << options.num_attention_heads << ")";
}

template <typename T>
T EncoderClassifierImpl::head_forward(const T& x) {
  // TE's head is Flax's nn.Dense, which TE's autocast does not reach (test_single_gpu_encoder.py
  // at d0067d0da: te_flax.DenseGeneral twice, then nn.Dense(features=2)): under FP8 training it
  // stays in high precision. A calibrating region (before serving with FP8 weights) is left as
  // it is, so the head's input scale is recorded like every other GEMM's.
  std::optional<te::Fp8Autocast> high_precision;
  if (te::fp8_enabled()) high_precision.emplace(false);
  return head(x);
}

void EncoderClassifierImpl::freeze_fp8_embedding(bool empty) {
  if (embedding_fp8.defined()) return;
  TE_CHECK(embedding.defined(), "EncoderClassifier: no embedding table to freeze");
  te::fp8::Fp8Tensor q;
  if (empty) {
    q.data = at::zeros(embedding.sizes(), at::kByte);
    q.scale_inv = at::ones({1});
  } else {
    q = te::fp8::quantize_to_own_scale(embedding, te::fp8::DType::kE4M3);
  }
  embedding_fp8 = register_buffer("embedding_fp8", q.data);
  embedding_fp8_scale_inv = register_buffer("embedding_fp8_scale_inv", q.scale_inv);
  parameters_.erase("embedding");
  embedding = at::Tensor();
}

at::Tensor EncoderClassifierImpl::forward(const at::Tensor& ids, const at::Tensor& mask) {
  at::Tensor x = embedding_fp8.defined()
                     ? te::fp8::Fp8Tensor{at::embedding(embedding_fp8, ids),
                                          embedding_fp8_scale_inv, te::fp8::DType::kE4M3}
                           .dequantize()
                     : at::embedding(embedding, ids);
  x = layer(x, mask);
  x = x.reshape({x.size(0), -1});
  x = dense_2(dense_1(x));
  return head_forward(x);
}

te::DTensor EncoderClassifierImpl::forward_on_mesh(const at::Tensor& ids, const at::Tensor& mask) {
  const te::DeviceMesh* mesh = te::current_mesh();
  TE_CHECK(mesh != nullptr, "EncoderClassifier::forward_on_mesh: no mesh in scope");
  const te::LogicalAxes act = {"batch", "seqlen", "hidden"};
  std::vector<te::Placement> layout(static_cast<std::size_t>(mesh->ndim()), te::Replicate{});
  if (const auto spec = te::resolve_logical_axes(act)) layout = te::placements_for(*spec, *mesh);
  // The ids laid out as the activations' first two dims; the table replicated, so where they
  // are split each rank's gradient of it is a partial sum, reduced in backward (F::embedding).
  std::vector<te::Placement> ids_layout = layout;
  for (te::Placement& p : ids_layout) {
    if (const auto* sh = std::get_if<te::Shard>(&p); sh != nullptr && sh->dim > 1) {
      p = te::Replicate{};
    }
  }
  const std::vector<te::Placement> whole(layout.size(), te::Replicate{});
  te::DTensor x = F::embedding(te::DTensor::distribute(ids, *mesh, ids_layout),
                               te::DTensor::from_local(embedding, *mesh, whole));
  x = layer(x, mask);
  // Whole sequences before flattening (sequence parallel gathers here), then TE's (batch, None).
  x = te::with_sharding_constraint(x, act);
  x = F::flatten(x, 1);
  x = te::with_sharding_constraint(x, {"batch", std::nullopt});
  x = dense_2(dense_1(x));
  return head_forward(x);
}

}  // namespace encoder
