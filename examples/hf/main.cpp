// te-embed: sentence embeddings with a Hugging Face sentence-transformers model (all-MiniLM-L6-v2
// and its kind) loaded into te::nn: prints the cosine similarity of two sentences (of every
// pair, given more), or with --bench FILE measures sentences per second over a file's lines.
//
//   te-embed --model all-MiniLM-L6-v2/ "A man is eating food." "A man is eating pasta."
//   te-embed --model DIR --nproc 2 "..." "..."           # tensor parallel over two thread ranks
//   te-embed --model DIR --bench sentences.txt [--batch 32] [--rounds 3] [--threads 2]

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "te/distributed.h"
#include "te/error.h"
#include "te/hf/sentence.h"

namespace {

// The embeddings of `texts`, on one process or tensor parallel over `nproc` thread ranks.
at::Tensor embed(const std::string& model, const std::vector<std::string>& texts, int nproc) {
  if (nproc == 1) return te::hf::SentenceEmbedder(model).embed(texts);
  at::Tensor out;
  std::mutex mutex;
  te::run_local_ranks(nproc, [&](int rank) {
    te::DeviceMesh mesh({nproc}, {"model"});
    te::MeshScope on(mesh);
    // TE's rules for a tensor-parallel mesh axis (heads, MLP), and the vocabulary over it too.
    te::MeshResourceScope tp(te::parse_mesh_resource("tp=model"));
    te::AxisRulesScope rules(te::extend_logical_axis_rules(te::parse_axis_rules("vocab=model")));
    const at::Tensor e = te::hf::SentenceEmbedder(model).embed(texts);
    std::lock_guard<std::mutex> lock(mutex);
    if (rank == 0) out = e;
  });
  return out;
}

// Sentences per second over the lines of `file`, in model calls of `batch` (sorted by length, as
// SentenceEmbedder::embed does): the best of `rounds` passes after one warm-up pass (the model
// loaded once, before).
int bench(const std::string& model, const std::string& file, int64_t batch, int rounds) {
  std::ifstream in(file);
  if (!in) throw te::Error("te-embed: cannot read '" + file + "'");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  if (lines.empty()) throw te::Error("te-embed: '" + file + "' holds no lines");
  const te::hf::SentenceEmbedder st(model);
  auto pass = [&] {
    const auto start = std::chrono::steady_clock::now();
    st.embed(lines, batch);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  pass();
  double best = 1e30;
  for (int r = 0; r < rounds; ++r) best = std::min(best, pass());
  std::printf(
      "{\"sentences\": %zu, \"batch\": %lld, \"threads\": %d, \"seconds\": %.6f, "
      "\"sentences_per_second\": %.2f}\n",
      lines.size(), static_cast<long long>(batch), at::get_num_threads(), best,
      static_cast<double>(lines.size()) / best);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "te-embed: sentence embeddings with a Hugging Face sentence-transformers model (e.g. "
      "all-MiniLM-L6-v2) in te::nn. Prints the cosine similarity of each pair of sentences."};
  std::string model, bench_file;
  std::vector<std::string> sentences;
  int nproc = 1, rounds = 3, threads = 0;
  int64_t batch = 32;
  app.add_option("--model", model,
                 "the model's folder (config.json, model.safetensors, tokenizer.json or "
                 "vocab.txt, and sentence-transformers' modules.json, 1_Pooling/)")
      ->required();
  app.add_option("sentences", sentences, "two or more sentences to compare");
  app.add_option("--nproc", nproc,
                 "tensor-parallel thread ranks (heads, MLP and vocabulary "
                 "sharded over them)")
      ->check(CLI::Range(1, 64));
  app.add_option("--bench", bench_file, "measure sentences/s over this file's lines instead");
  app.add_option("--batch", batch, "sentences per model call with --bench")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--rounds", rounds, "timed passes with --bench (the best is reported)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--threads", threads, "intra-op threads (0: LibTorch's default)")
      ->check(CLI::Range(0, 1024));
  CLI11_PARSE(app, argc, argv);
  try {
    if (threads > 0) at::set_num_threads(threads);
    if (!bench_file.empty()) return bench(model, bench_file, batch, rounds);
    if (sentences.size() < 2) {
      std::fprintf(stderr, "te-embed: give at least two sentences to compare (or --bench)\n");
      return 2;
    }
    const at::Tensor e = embed(model, sentences, nproc);
    const at::Tensor unit = e / e.norm(2, -1, true).clamp_min(1e-12);
    const at::Tensor cos = unit.matmul(unit.t());
    for (std::size_t i = 0; i < sentences.size(); ++i) {
      for (std::size_t j = i + 1; j < sentences.size(); ++j) {
        std::printf("%.6f\t%s\t%s\n",
                    cos[static_cast<int64_t>(i)][static_cast<int64_t>(j)].item<double>(),
                    sentences[i].c_str(), sentences[j].c_str());
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "te-embed: %s\n", e.what());
    return 1;
  }
  return 0;
}
