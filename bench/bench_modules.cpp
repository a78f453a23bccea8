// Module overhead on one process: each te::nn module against the same math written in plain
// LibTorch ops (its parameters copied, its output checked equal before timing), and
// MultiHeadAttention / TransformerLayer also against LibTorch's own torch::nn modules of the
// same size. Forward (under InferenceMode) and forward+backward; fp32 and bf16; alternated call
// by call (alternate.h); ratio_vs_<anchor> = te median / anchor median.
//   bench_modules [--benchmark_filter=...]
// Arguments of each case: tokens, hidden, ffn, dtype (0 fp32, 1 bf16), pass (0 forward, 1
// forward+backward). Tokens are sequences of 128; heads are hidden / 64 (at least 4).
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <c10/core/InferenceMode.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/transformerlayer.h>

#include <chrono>
#include <functional>
#include <string>

#include "alternate.h"
#include "plain_layer.h"
#include "te/nn.h"

namespace {

using te::bench::copy_parameters;
using te::bench::param;
using te::bench::plain_layer_norm;
using te::bench::plain_mha;
using te::bench::plain_mlp;

constexpr int64_t kSeq = 128;
using Forward = std::function<at::Tensor(const at::Tensor&)>;

struct Shape {
  int64_t tokens, hidden, ffn, heads;
  at::ScalarType dtype;
  bool backward;
  explicit Shape(const benchmark::State& s)
      : tokens(s.range(0)),
        hidden(s.range(1)),
        ffn(s.range(2)),
        heads(std::max<int64_t>(4, s.range(1) / 64)),
        dtype(s.range(3) ? at::kBFloat16 : at::kFloat),
        backward(s.range(4) != 0) {}
  int64_t batch() const { return tokens / kSeq; }
};

void clear_grads(std::vector<at::Tensor>& tensors) {
  for (at::Tensor& t : tensors) t.mutable_grad().reset();
}

// Times `te` against `anchor` on the same input, after checking (when `same_math`) that they
// compute the same output.
void compare(benchmark::State& state, const Shape& shape, const Forward& te,
             std::vector<at::Tensor> te_params, const Forward& anchor,
             std::vector<at::Tensor> anchor_params, const at::Tensor& x_te,
             const at::Tensor& x_anchor, const std::string& anchor_name, bool same_math) {
  if (same_math) {
    c10::InferenceMode guard;
    const at::Tensor a = te(x_te).to(at::kFloat), b = anchor(x_anchor).to(at::kFloat);
    const double tol = shape.dtype == at::kFloat ? 1e-3 : 5e-2;
    const double diff = (a - b).abs().max().item<double>();
    const double scale = b.abs().max().item<double>() + 1e-6;
    if (!(diff <= tol * scale)) {
      state.SkipWithError(("the plain version differs from te: max |diff| " + std::to_string(diff) +
                           " against max |y| " + std::to_string(scale))
                              .c_str());
      return;
    }
  }
  auto timed = [&](const Forward& f, const at::Tensor& x, std::vector<at::Tensor>& params) {
    return [&f, &x, &params, &shape] {
      const auto start = std::chrono::steady_clock::now();
      if (shape.backward) {
        clear_grads(params);
        f(x).sum().backward();
      } else {
        c10::InferenceMode guard;
        benchmark::DoNotOptimize(f(x).data_ptr());
      }
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
  };
  te::bench::alternate(state, timed(te, x_te, te_params), timed(anchor, x_anchor, anchor_params),
                       anchor_name, shape.tokens >= 8192 ? 1 : 3);
}

at::Tensor input(const Shape& shape) {
  at::manual_seed(0);
  return at::randn({shape.batch(), kSeq, shape.hidden}).to(shape.dtype).requires_grad_(true);
}

std::vector<at::Tensor> params_of(torch::nn::Module& module) { return module.parameters(); }
std::vector<at::Tensor> values(const te::bench::Params& params) {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : params) out.push_back(t);
  return out;
}

// `module` (in the case's dtype) against `plain(x, its copied parameters)`, the same math.
template <typename Module, typename Plain>
void against_plain(benchmark::State& state, const Shape& shape, Module module, Plain plain) {
  module->to(shape.dtype);
  const te::bench::Params p = copy_parameters(*module);
  const at::Tensor x = input(shape);
  compare(
      state, shape, [&](const at::Tensor& in) { return module->forward(in); }, params_of(*module),
      [&](const at::Tensor& in) { return plain(in, p); }, values(p), x, x, "plain", true);
}

// ---- cases ---------------------------------------------------------------------------------

void BM_Dense(benchmark::State& state) {
  const Shape shape(state);
  against_plain(state, shape, te::nn::Dense(te::nn::DenseOptions(shape.hidden, shape.ffn)),
                [](const at::Tensor& x, const te::bench::Params& p) {
                  return at::matmul(x, param(p, "kernel")) + param(p, "bias");
                });
}

void BM_LayerNormDense(benchmark::State& state) {
  const Shape shape(state);
  against_plain(
      state, shape, te::nn::LayerNormDense(te::nn::LayerNormDenseOptions(shape.hidden, shape.ffn)),
      [](const at::Tensor& x, const te::bench::Params& p) {
        const at::Tensor ln =
            plain_layer_norm(x, param(p, "layernorm.scale"), param(p, "layernorm.ln_bias"));
        return at::matmul(ln, param(p, "dense.kernel")) + param(p, "dense.bias");
      });
}

void BM_LayerNormMLP(benchmark::State& state) {
  const Shape shape(state);
  against_plain(
      state, shape,
      te::nn::LayerNormMLP(te::nn::LayerNormMLPOptions(shape.hidden, shape.ffn)
                               .activations({"gelu"})
                               .intermediate_dropout_rate(0.0)),
      [](const at::Tensor& x, const te::bench::Params& p) { return plain_mlp(x, p, ""); });
}

void BM_MultiHeadAttention(benchmark::State& state) {
  const Shape shape(state);
  against_plain(
      state, shape,
      te::nn::MultiHeadAttention(te::nn::MultiHeadAttentionOptions(shape.hidden, shape.heads)),
      [&](const at::Tensor& x, const te::bench::Params& p) {
        return plain_mha(x, p, "", shape.heads);
      });
}

// Against torch::nn::MultiheadAttention: both with biases and no input norm, causal; LibTorch's
// takes [seq, batch, hidden] (its input is made in that layout, outside the timing).
void BM_MultiHeadAttentionVsTorch(benchmark::State& state) {
  const Shape shape(state);
  te::nn::MultiHeadAttention mha(te::nn::MultiHeadAttentionOptions(shape.hidden, shape.heads)
                                     .input_layernorm(false)
                                     .use_bias(true));
  mha->to(shape.dtype);
  torch::nn::MultiheadAttention torch_mha(shape.hidden, shape.heads);
  torch_mha->to(shape.dtype);
  const at::Tensor x = input(shape);
  const at::Tensor x_sbh = x.detach().transpose(0, 1).contiguous().requires_grad_(true);
  const at::Tensor causal = at::ones({kSeq, kSeq}, at::TensorOptions(at::kBool)).triu(1);
  compare(
      state, shape, [&](const at::Tensor& in) { return mha->forward(in); }, params_of(*mha),
      [&](const at::Tensor& in) {
        return std::get<0>(torch_mha->forward(in, in, in, {}, /*need_weights=*/false, causal));
      },
      params_of(*torch_mha), x, x_sbh, "torch_nn", false);
}

te::nn::TransformerLayerOptions layer_options(const Shape& shape) {
  return [&] {
    auto made = te::nn::TransformerLayerOptions(shape.hidden, shape.ffn, shape.heads)
                    .hidden_dropout(0.0)
                    .intermediate_dropout(0.0)
                    .mlp_activations({"gelu"});
    made.self_attention().attention().attention_dropout(0.0);
    return made;
  }();
}

void BM_TransformerLayer(benchmark::State& state) {
  const Shape shape(state);
  against_plain(state, shape, te::nn::TransformerLayer(layer_options(shape)),
                [&](const at::Tensor& x, const te::bench::Params& p) {
                  return te::bench::plain_layer(x, p, shape.heads);
                });
}

// Against torch::nn::TransformerEncoderLayer (post-norm, exact gelu, biases): the same sizes,
// te's layer with biases too; causal.
void BM_TransformerLayerVsTorch(benchmark::State& state) {
  const Shape shape(state);
  te::nn::TransformerLayerOptions options = layer_options(shape);
  options.self_attention().use_bias(true);
  te::nn::TransformerLayer layer(options);
  layer->to(shape.dtype);
  torch::nn::TransformerEncoderLayer torch_layer(
      torch::nn::TransformerEncoderLayerOptions(shape.hidden, shape.heads)
          .dim_feedforward(shape.ffn)
          .dropout(0.0)
          .activation(torch::kGELU));
  torch_layer->to(shape.dtype);
  const at::Tensor x = input(shape);
  const at::Tensor x_sbh = x.detach().transpose(0, 1).contiguous().requires_grad_(true);
  const at::Tensor causal = at::zeros({kSeq, kSeq}, at::TensorOptions(shape.dtype))
                                .masked_fill(at::ones({kSeq, kSeq}, at::kBool).triu(1), -1e10);
  compare(
      state, shape, [&](const at::Tensor& in) { return layer->forward(in); }, params_of(*layer),
      [&](const at::Tensor& in) { return torch_layer->forward(in, causal); },
      params_of(*torch_layer), x, x_sbh, "torch_nn", false);
}

// TE's tanh-form gelu as te's MLP runs it (te::nn::functional::activation "gelu") against the
// exact (erf) gelu torch::nn::TransformerEncoderLayer uses, on [tokens, ffn]: the goal is the
// tanh form within 1.2x of the exact one's time in each dtype.
void BM_GeluTanhVsExact(benchmark::State& state) {
  const Shape shape(state);
  at::manual_seed(0);
  const at::Tensor x =
      at::randn({shape.tokens, shape.ffn}).to(shape.dtype).requires_grad_(shape.backward);
  std::vector<at::Tensor> none;
  compare(
      state, shape, [](const at::Tensor& in) { return te::nn::functional::activation(in, "gelu"); },
      none, [](const at::Tensor& in) { return at::gelu(in); }, none, x, x, "exact_gelu", false);
}
BENCHMARK(BM_GeluTanhVsExact)
    ->Args({2048, 256, 1024, 0, 1})
    ->Args({2048, 256, 1024, 1, 1})
    ->ArgNames({"tokens", "hidden", "ffn", "bf16", "backward"})
    ->Iterations(15)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// GroupedLinear (one autograd node for every expert's GEMM) against the loop it replaces: each
// expert's rows sliced, through its own kernel and bias (addmm), and the results concatenated
// (nodes, a slice and a copy per expert). Rows are tokens x top-2 routed by a softmax router over
// random logits (uneven groups); arguments: rows, hidden, ffn, bf16, backward, experts. The issue's
// goal: the grouped form faster than the loop on many small experts.
void BM_GroupedLinearVsLoop(benchmark::State& state) {
  const Shape shape(state);
  const int64_t experts = state.range(5);
  at::manual_seed(0);
  te::nn::functional::RouterOptions router;
  router.topk = 2;
  const at::Tensor map =
      te::nn::functional::topk_with_score_function(at::randn({shape.tokens / 2, experts}), router)
          .routing_map;
  const at::Tensor counts = map.to(at::kLong).sum(0);
  const std::vector<int64_t> splits(counts.data_ptr<int64_t>(),
                                    counts.data_ptr<int64_t>() + experts);
  te::nn::GroupedLinear grouped(te::nn::GroupedLinearOptions(experts, shape.hidden, shape.ffn));
  grouped->to(shape.dtype);
  {
    torch::NoGradGuard no_grad;
    grouped->bias.normal_();
  }
  // The loop's experts as separate parameters (TE-PyTorch's weight0..N, a ModuleList of
  // Linear): slicing one stacked kernel would add a kernel-sized gradient per expert.
  std::vector<at::Tensor> kernels, biases, loop_params;
  for (int64_t g = 0; g < experts; ++g) {
    kernels.push_back(grouped->kernel[g].detach().clone().requires_grad_(true));
    biases.push_back(grouped->bias[g].detach().clone().requires_grad_(true));
    loop_params.push_back(kernels.back());
    loop_params.push_back(biases.back());
  }
  const at::Tensor x =
      at::randn({shape.tokens, shape.hidden}).to(shape.dtype).requires_grad_(shape.backward);
  const auto loop = [&](const at::Tensor& in) {
    std::vector<at::Tensor> parts;
    int64_t row = 0;
    for (int64_t g = 0; g < experts; ++g) {
      parts.push_back(at::addmm(biases[g], in.narrow(0, row, splits[g]), kernels[g]));
      row += splits[g];
    }
    return at::cat(parts, 0);
  };
  compare(
      state, shape, [&](const at::Tensor& in) { return grouped->forward(in, splits); },
      params_of(*grouped), loop, loop_params, x, x, "loop", true);
}
BENCHMARK(BM_GroupedLinearVsLoop)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int64_t experts : {8, 64, 256})
        for (int64_t dtype : {0, 1}) b->Args({4096, 256, 512, dtype, 1, experts});
      b->ArgNames({"rows", "hidden", "ffn", "bf16", "backward", "experts"});
    })
    ->Iterations(15)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// LayerNormMoE (RMSNorm, softmax router, top-2 renormalised, SwiGLU experts as grouped GEMMs)
// against the same math in plain LibTorch as transformers' eager experts compute it: each hit
// expert's tokens gathered, through its own gate/up and down kernels (separate parameters, a
// ModuleList's), weighted and index_add-ed back. Arguments: tokens, hidden, ffn (per expert),
// bf16, backward, experts. The bar: forward+backward at most 1.1x the plain loop's time.
void BM_MoELayerVsTorch(benchmark::State& state) {
  const Shape shape(state);
  const int64_t experts = state.range(5), h = shape.hidden, f = shape.ffn;
  te::nn::manual_seed(0);
  auto o = te::nn::LayerNormMoEOptions(h, f, experts);
  o.layernorm().layernorm_type("rmsnorm");
  o.router().topk = 2;
  te::nn::LayerNormMoE moe(o);
  moe->to(shape.dtype);
  std::vector<at::Tensor> gate_up, down, loop_params;
  const at::Tensor scale = moe->layernorm->scale.detach().clone().requires_grad_(true);
  const at::Tensor router = moe->gate_kernel.detach().clone().requires_grad_(true);
  loop_params = {scale, router};
  for (int64_t e = 0; e < experts; ++e) {
    gate_up.push_back(moe->wi_kernel[e].reshape({h, 2 * f}).detach().clone().requires_grad_(true));
    down.push_back(moe->wo_kernel[e].detach().clone().requires_grad_(true));
    loop_params.push_back(gate_up.back());
    loop_params.push_back(down.back());
  }
  const double eps = o.layernorm().epsilon();
  const auto loop = [&](const at::Tensor& in) {
    const at::Tensor x = in.reshape({-1, h});
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor ln = (xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps)).to(x.scalar_type()) *
                          scale;
    const at::Tensor probs = at::softmax(at::matmul(ln, router).to(at::kFloat), -1);
    auto [top, idx] = at::topk(probs, 2);
    top = (top / top.sum(-1, true)).to(x.scalar_type());
    at::Tensor out = at::zeros_like(ln);
    const at::Tensor hit = at::one_hot(idx, experts).sum(1).sum(0).gt(0).nonzero().cpu();
    for (int64_t i = 0; i < hit.size(0); ++i) {
      const int64_t e = hit[i][0].item<int64_t>();
      const auto where = at::where(idx.eq(e));
      const at::Tensor& token = where[0];
      const at::Tensor g = at::matmul(ln.index_select(0, token), gate_up[e]);
      const at::Tensor act = at::silu(g.narrow(1, 0, f)) * g.narrow(1, f, f);
      const at::Tensor y = at::matmul(act, down[e]) * top.index({where[0], where[1]}).unsqueeze(1);
      out = out.index_add(0, token, y);
    }
    return out.view(in.sizes());
  };
  const at::Tensor x =
      at::randn({shape.batch(), kSeq, h}).to(shape.dtype).requires_grad_(shape.backward);
  compare(
      state, shape, [&](const at::Tensor& in) { return moe->forward(in); }, params_of(*moe), loop,
      loop_params, x, x, "torch_loop", true);
}
BENCHMARK(BM_MoELayerVsTorch)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (int64_t experts : {8, 64})
        for (int64_t dtype : {0, 1}) b->Args({4096, 256, 512, dtype, 1, experts});
      b->ArgNames({"tokens", "hidden", "ffn", "bf16", "backward", "experts"});
    })
    ->Iterations(10)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// Google Benchmark fixes iterations per family: the small shape's cases and the large shape's
// cases are registered separately so the large ones (1-6 s a call here) run 5 rounds, and
// forward+backward only.
#define TE_BENCH_MODULE(fn)                                                    \
  BENCHMARK(fn)                                                                \
      ->Apply([](benchmark::internal::Benchmark* b) {                          \
        for (int64_t dtype : {0, 1})                                           \
          for (int64_t pass : {0, 1}) b->Args({2048, 256, 1024, dtype, pass}); \
        b->ArgNames({"tokens", "hidden", "ffn", "bf16", "backward"});          \
      })                                                                       \
      ->Iterations(15)                                                         \
      ->UseRealTime()                                                          \
      ->Unit(benchmark::kMillisecond);                                         \
  BENCHMARK(fn)                                                                \
      ->Apply([](benchmark::internal::Benchmark* b) {                          \
        for (int64_t dtype : {0, 1}) b->Args({8192, 1024, 4096, dtype, 1});    \
        b->ArgNames({"tokens", "hidden", "ffn", "bf16", "backward"});          \
      })                                                                       \
      ->Iterations(5)                                                          \
      ->UseRealTime()                                                          \
      ->Unit(benchmark::kMillisecond)

TE_BENCH_MODULE(BM_Dense);
TE_BENCH_MODULE(BM_LayerNormDense);
TE_BENCH_MODULE(BM_LayerNormMLP);
TE_BENCH_MODULE(BM_MultiHeadAttention);
TE_BENCH_MODULE(BM_MultiHeadAttentionVsTorch);
TE_BENCH_MODULE(BM_TransformerLayer);
TE_BENCH_MODULE(BM_TransformerLayerVsTorch);

}  // namespace

int main(int argc, char** argv) { return te::bench::run_benchmarks(argc, argv); }
