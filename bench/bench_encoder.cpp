// One training step (forward, backward, AdamW) of te-encoder's classifier on one process against
// the same model written with plain LibTorch modules (torch::nn::Embedding, LayerNorm, Linear,
// Dropout; attention as matmul + masked softmax), same shapes, same math, same optimiser. The
// two are alternated step by step on the same batches; the figure to read is
// ratio_vs_libtorch (te step time / plain step time, medians).

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "alternate.h"
#include "te/encoder/data.h"
#include "te/encoder/model.h"

namespace {

// The same classifier in plain LibTorch: pre-LN attention and relu MLP blocks without biases,
// dropout 0.1 after attention probabilities, after each block and after the MLP activation.
struct PlainEncoderImpl : torch::nn::Module {
  PlainEncoderImpl(int64_t vocab, int64_t seq, int64_t hidden, int64_t ffn, int64_t heads)
      : heads(heads),
        embed(register_module("embed", torch::nn::Embedding(vocab, hidden))),
        ln1(register_module("ln1",
                            torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden}).eps(1e-6)))),
        ln2(register_module("ln2",
                            torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden}).eps(1e-6)))),
        qkv(register_module(
            "qkv", torch::nn::Linear(torch::nn::LinearOptions(hidden, 3 * hidden).bias(false)))),
        out(register_module(
            "out", torch::nn::Linear(torch::nn::LinearOptions(hidden, hidden).bias(false)))),
        fc1(register_module("fc1",
                            torch::nn::Linear(torch::nn::LinearOptions(hidden, ffn).bias(false)))),
        fc2(register_module("fc2",
                            torch::nn::Linear(torch::nn::LinearOptions(ffn, hidden).bias(false)))),
        d1(register_module("d1", torch::nn::Linear(seq * hidden, hidden))),
        d2(register_module("d2", torch::nn::Linear(hidden, hidden))),
        head(register_module("head", torch::nn::Linear(hidden, 2))),
        drop(register_module("drop", torch::nn::Dropout(0.1))) {}

  at::Tensor forward(const at::Tensor& ids, const at::Tensor& mask) {
    at::Tensor x = embed(ids);
    const int64_t b = x.size(0), s = x.size(1), h = x.size(2), d = h / heads;
    at::Tensor q_k_v = qkv(ln1(x)).view({b, s, 3, heads, d});
    at::Tensor q = q_k_v.select(2, 0).transpose(1, 2), k = q_k_v.select(2, 1).transpose(1, 2),
               v = q_k_v.select(2, 2).transpose(1, 2);
    at::Tensor logits = at::matmul(q, k.transpose(-2, -1)).masked_fill(mask, -1e10);
    at::Tensor probs = drop(at::softmax(logits, -1));
    at::Tensor a = at::matmul(probs, v).transpose(1, 2).reshape({b, s, h});
    x = x + drop(out(a));
    x = x + drop(fc2(drop(at::relu(fc1(ln2(x))))));
    return head(d2(d1(x.reshape({b, -1}))));
  }

  int64_t heads;
  torch::nn::Embedding embed;
  torch::nn::LayerNorm ln1, ln2;
  torch::nn::Linear qkv, out, fc1, fc2, d1, d2, head;
  torch::nn::Dropout drop;
};
TORCH_MODULE(PlainEncoder);

template <typename Model>
double step(Model& model, torch::optim::AdamW& opt, const at::Tensor& ids, const at::Tensor& mask,
            const at::Tensor& labels) {
  const auto start = std::chrono::steady_clock::now();
  opt.zero_grad();
  at::Tensor loss = at::cross_entropy_loss(model->forward(ids, mask), labels);
  loss.backward();
  opt.step();
  benchmark::DoNotOptimize(loss.item<double>());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// TE's single-process run: batch 64, seq 32, hidden 256, ffn 1024, 8 heads, vocab ~6000.
void EncoderTrainingStep(benchmark::State& state) {
  const int64_t batch = state.range(0), seq = state.range(1), hidden = 256, ffn = 1024;
  const int64_t heads = 8, vocab = 6000;
  te::nn::manual_seed(0);
  encoder::EncoderOptions options;
  options.vocab_size = vocab;
  options.max_seq_len = seq;
  encoder::EncoderClassifier te_model(options);
  PlainEncoder plain(vocab, seq, hidden, ffn, heads);
  auto adamw = [](std::vector<at::Tensor> params) {
    return torch::optim::AdamW(std::move(params),
                               torch::optim::AdamWOptions(1e-4).weight_decay(1e-4));
  };
  torch::optim::AdamW te_opt = adamw(te_model->parameters());
  torch::optim::AdamW plain_opt = adamw(plain->parameters());
  at::Generator gen = at::detail::createCPUGenerator(1);
  const at::Tensor ids = at::randint(2, vocab, {batch, seq}, gen, at::kLong);
  const at::Tensor lengths = at::randint(4, seq + 1, {batch}, gen, at::kLong);
  const at::Tensor mask = encoder::padding_mask(lengths, seq);
  const at::Tensor labels = at::randint(0, 2, {batch}, gen, at::kLong);
  const double te_med = te::bench::alternate(
      state, [&] { return step(te_model, te_opt, ids, mask, labels); },
      [&] { return step(plain, plain_opt, ids, mask, labels); }, "libtorch");
  state.counters["te_samples_per_s"] = batch / te_med;
}
BENCHMARK(EncoderTrainingStep)
    ->Args({64, 32})
    ->Args({256, 64})
    ->ArgNames({"batch", "seq"})
    ->Iterations(15)
    ->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) { return te::bench::run_benchmarks(argc, argv); }
