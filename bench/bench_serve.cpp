// te-serve's model call (tokenize, pad, forward under InferenceMode, softmax) per batch size, for
// fp32 and FP8 weights, on 1 and 2 intra-op threads: sentences/s (items_per_second). The rate at
// batch 32 over the rate at batch 1 is the most dynamic batching can gain on this machine. The
// model is te-encoder's CoLA classifier (random weights with calibrated FP8 scales, written to a
// temporary checkpoint), on CoLA dev sentences.
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <c10/core/InferenceMode.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <memory>

#include "te/nn.h"
#include "te/serve/service.h"

namespace {

namespace fs = std::filesystem;

struct Fixture {
  Fixture() {
    dir = fs::temp_directory_path() / ("te-bench-serve-" + std::to_string(::getpid()));
    const auto [train_file, dev_file] = encoder::cola_files(TE_COLA_DIR);
    const auto train = encoder::read_cola_tsv(train_file);
    for (const auto& e : encoder::read_cola_tsv(dev_file)) sentences.push_back(e.sentence);
    encoder::Vocabulary vocab;
    vocab.add(train);
    encoder::EncoderOptions options;
    options.vocab_size = vocab.size();
    te::nn::manual_seed(0);
    encoder::EncoderClassifier model(options);
    model->eval();
    {
      c10::InferenceMode inference;
      te::Fp8Autocast calibrate(false, te::fp8::DelayedScaling{}, std::nullopt, true);
      const auto batch = encoder::encode(train, vocab, options.max_seq_len);
      const at::Tensor ids = batch.ids.narrow(0, 0, 256);
      model->forward(ids,
                     encoder::padding_mask(batch.lengths.narrow(0, 0, 256), options.max_seq_len));
    }
    const nlohmann::json config = {
        {"vocabulary", vocab.words()},          {"max_seq_len", options.max_seq_len},
        {"hidden_size", options.hidden_size},   {"mlp_hidden_size", options.mlp_hidden_size},
        {"heads", options.num_attention_heads}, {"mlp_activations", "relu"}};
    te::nn::save_checkpoint(*model, dir.string(), config.dump());
    fp32 = std::make_unique<te::serve::Classifier>(dir.string(), false);
    fp8 = std::make_unique<te::serve::Classifier>(dir.string(), true);
  }
  ~Fixture() { fs::remove_all(dir); }
  fs::path dir;
  std::vector<std::string> sentences;
  std::unique_ptr<te::serve::Classifier> fp32, fp8;
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

void BM_Classify(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const bool fp8 = state.range(1) != 0;
  const int threads = static_cast<int>(state.range(2));
  at::set_num_threads(threads);
  Fixture& f = fixture();
  const te::serve::Classifier& c = fp8 ? *f.fp8 : *f.fp32;
  std::size_t next = 0;
  for (auto _ : state) {
    std::vector<std::string> part;
    for (int i = 0; i < batch; ++i) part.push_back(f.sentences[next++ % f.sentences.size()]);
    benchmark::DoNotOptimize(c.classify(part));
  }
  state.SetItemsProcessed(state.iterations() * batch);
  state.SetLabel(std::string(fp8 ? "fp8 weights" : "fp32") + ", " + std::to_string(threads) +
                 " thread" + (threads == 1 ? "" : "s"));
}

}  // namespace

BENCHMARK(BM_Classify)
    ->ArgNames({"batch", "fp8", "threads"})
    ->ArgsProduct({{1, 4, 16, 32, 64}, {0, 1}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0)
    ->UseRealTime();

BENCHMARK_MAIN();
