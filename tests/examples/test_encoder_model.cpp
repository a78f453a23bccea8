// te-encoder's classifier as a module: what runs in FP8 under TE's recipe.

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "te/encoder/data.h"
#include "te/encoder/model.h"
#include "te/fp8.h"

namespace {

at::Tensor buffer(const torch::nn::Module& m, const std::string& name) {
  for (const auto& b : m.named_buffers()) {
    if (b.key() == name) return b.value();
  }
  ADD_FAILURE() << "no buffer " << name;
  return at::Tensor();
}

// TE's example runs its TransformerLayer and both DenseGeneral layers in FP8, but the head is
// Flax's nn.Dense, outside TE's autocast: its GEMM stays in high precision and records no amax.
TEST(EncoderModel, TheHeadStaysInHighPrecisionUnderFp8AsTes) {
  te::nn::manual_seed(0);
  encoder::EncoderOptions o;
  o.vocab_size = 40;
  o.max_seq_len = 8;
  o.hidden_size = 32;
  o.mlp_hidden_size = 64;
  o.num_attention_heads = 4;
  encoder::EncoderClassifier model(o);
  model->train();
  const at::Tensor ids = at::randint(2, 40, {4, 8}, at::kLong);
  const at::Tensor mask = encoder::padding_mask(at::tensor({8, 5, 3, 8}, at::kLong), 8);
  {
    te::Fp8Autocast fp8(true, te::fp8::DelayedScaling{});
    const at::Tensor logits = model(ids, mask);
    EXPECT_EQ(logits.sizes(), at::IntArrayRef({4, 2}));
    logits.sum().backward();
  }
  EXPECT_GT(buffer(*model->dense_2, "fp8_fwd_amax_history").abs().max().item<double>(), 0.0);
  EXPECT_GT(buffer(*model->dense_1, "fp8_bwd_amax_history").abs().max().item<double>(), 0.0);
  EXPECT_EQ(buffer(*model->head, "fp8_fwd_amax_history").abs().max().item<double>(), 0.0);
  EXPECT_EQ(buffer(*model->head, "fp8_bwd_amax_history").abs().max().item<double>(), 0.0);

  // Calibrating before serving with FP8 weights still records the head's input amax.
  model->eval();
  {
    te::Fp8Autocast calibrate(false, te::fp8::DelayedScaling{}, std::nullopt, true);
    model(ids, mask);
  }
  EXPECT_GT(buffer(*model->head, "fp8_fwd_amax_history").abs().max().item<double>(), 0.0);
}

}  // namespace
