// te-embed: sentence embeddings with a Hugging Face sentence-transformers model (all-MiniLM-L6-v2
// and its kind) loaded into te::nn: prints the cosine similarity of two sentences (of every
// pair, given more), or with --bench FILE measures sentences per second over a file's lines.
//
//   te-embed --model all-MiniLM-L6-v2/ "A man is eating food." "A man is eating pasta."
//   te-embed --model DIR --nproc 2 "..." "..."           # tensor parallel over two thread ranks
//   te-embed --model DIR --bench sentences.txt [--batch 32] [--rounds 3] [--threads 2]
//   te-embed --model DIR --input lines.txt --output embeddings.npy  # [lines, dim] float32
//   te-embed --model DIR --fp8-weights [--calibration FILE] ...   # FP8 kernels and tables

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "te/distributed.h"
#include "te/error.h"
#include "te/hf/sentence.h"
#include "te/nn/inference.h"
#include "te/runtime/runtime.h"

namespace {

std::vector<std::string> read_lines(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw te::Error("te-embed: cannot read '" + file + "'");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  if (lines.empty()) throw te::Error("te-embed: '" + file + "' holds no lines");
  return lines;
}

// FP8 weights, when asked: te::hf::SentenceEmbedder::freeze_fp8_weights calibrated on
// `calibration` (the lines of --calibration, else the texts to embed).
struct Fp8 {
  bool on = false;
  std::vector<std::string> calibration;
  void apply(te::hf::SentenceEmbedder& st, const std::vector<std::string>& texts) const {
    if (on) st.freeze_fp8_weights(calibration.empty() ? texts : calibration);
  }
};

// The embeddings of `texts`, on one process or tensor parallel over `nproc` thread ranks.
at::Tensor embed(const std::string& model, const std::vector<std::string>& texts, int nproc,
                 const Fp8& fp8) {
  if (nproc == 1) {
    te::hf::SentenceEmbedder st(model);
    fp8.apply(st, texts);
    return st.embed(texts);
  }
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

// `e` [n, dim] float32 as a NumPy .npy file (format 1.0, little-endian, C order).
void write_npy(const std::string& file, const at::Tensor& e) {
  const at::Tensor c = e.to(at::kFloat).contiguous();
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                       std::to_string(c.size(0)) + ", " + std::to_string(c.size(1)) + "), }";
  // Magic (6) + version (2) + length (2) + header + '\n', padded to a multiple of 64.
  header.append(63 - (10 + header.size()) % 64, ' ');
  header += '\n';
  std::ofstream out(file, std::ios::binary);
  if (!out) throw te::Error("te-embed: cannot write '" + file + "'");
  const auto len = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(len_bytes, 2);
  out << header;
  out.write(reinterpret_cast<const char*>(c.data_ptr<float>()),
            static_cast<std::streamsize>(c.numel() * sizeof(float)));
  if (!out) throw te::Error("te-embed: writing '" + file + "' failed");
}

// Sentences per second over the lines of `file`, in model calls of `batch` (sorted by length, as
// SentenceEmbedder::embed does): the best of `rounds` passes after one warm-up pass (the model
// loaded once, before).
int bench(const std::string& model, const std::string& file, int64_t batch, int rounds,
          const Fp8& fp8) {
  const std::vector<std::string> lines = read_lines(file);
  te::hf::SentenceEmbedder st(model);
  fp8.apply(st, lines);
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
      "\"sentences_per_second\": %.2f, \"weights\": \"%s\", \"weight_bytes\": %lld}\n",
      lines.size(), static_cast<long long>(batch), at::get_num_threads(), best,
      static_cast<double>(lines.size()) / best, fp8.on ? "fp8" : "fp32",
      static_cast<long long>(te::nn::resident_bytes(*st.encoder())));
  return 0;
}

// The cosine similarity of each pair of sentences, one pair a line.
void print_cosines(const std::vector<std::string>& sentences, const at::Tensor& e) {
  const at::Tensor unit = e / e.norm(2, -1, true).clamp_min(1e-12);
  const at::Tensor cos = unit.matmul(unit.t());
  for (std::size_t i = 0; i < sentences.size(); ++i) {
    for (std::size_t j = i + 1; j < sentences.size(); ++j) {
      std::printf("%.6f\t%s\t%s\n",
                  cos[static_cast<int64_t>(i)][static_cast<int64_t>(j)].item<double>(),
                  sentences[i].c_str(), sentences[j].c_str());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  te::keep_freed_memory();  // steps reuse freed memory (te/runtime/runtime.h)
  CLI::App app{
      "te-embed: sentence embeddings with a Hugging Face sentence-transformers model (e.g. "
      "all-MiniLM-L6-v2) in te::nn. Prints the cosine similarity of each pair of sentences."};
  app.footer(te::nn::cpu_gemm_summary());
  std::string model, bench_file, calibration_file, input_file, output_file;
  Fp8 fp8;
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
  app.add_option("--input", input_file, "embed this file's lines (one sentence per line)");
  app.add_option("--output", output_file,
                 "write the embeddings [sentences, dimensions] as float32 to this .npy file "
                 "instead of printing cosines");
  app.add_option("--bench", bench_file, "measure sentences/s over this file's lines instead");
  app.add_option("--batch", batch, "sentences per model call with --bench")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--rounds", rounds, "timed passes with --bench (the best is reported)")
      ->check(CLI::Range(1, 1000));
  app.add_option("--threads", threads, "intra-op threads (0: LibTorch's default)")
      ->check(CLI::Range(0, 1024));
  app.add_flag("--fp8-weights", fp8.on,
               "hold every GEMM kernel and embedding table in FP8 (E4M3, about a quarter of the "
               "fp32 bytes; one process), input scales calibrated first");
  app.add_option("--calibration", calibration_file,
                 "with --fp8-weights: calibrate on this file's lines (default: the texts to "
                 "embed)");
  CLI11_PARSE(app, argc, argv);
  if (fp8.on && nproc > 1) {
    std::fprintf(stderr, "te-embed: --fp8-weights serves on one process; drop --nproc\n");
    return 2;
  }
  if (!bench_file.empty() && (!input_file.empty() || !output_file.empty() || !sentences.empty())) {
    std::fprintf(stderr,
                 "te-embed: --bench measures over its own file; drop the sentences, --input and "
                 "--output\n");
    return 2;
  }
  if (!fp8.on && !calibration_file.empty()) {
    std::fprintf(stderr, "te-embed: --calibration needs --fp8-weights\n");
    return 2;
  }
  try {
    if (threads > 0) at::set_num_threads(threads);
    if (!calibration_file.empty()) fp8.calibration = read_lines(calibration_file);
    if (!bench_file.empty()) return bench(model, bench_file, batch, rounds, fp8);
    if (!input_file.empty()) {
      const std::vector<std::string> lines = read_lines(input_file);
      sentences.insert(sentences.end(), lines.begin(), lines.end());
    }
    if (sentences.empty() || (output_file.empty() && sentences.size() < 2)) {
      std::fprintf(stderr,
                   "te-embed: give at least two sentences to compare (or --input, --output, "
                   "--bench)\n");
      return 2;
    }
    const at::Tensor e = embed(model, sentences, nproc, fp8);
    if (!output_file.empty()) {
      write_npy(output_file, e);
      return 0;
    }
    print_cosines(sentences, e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "te-embed: %s\n", e.what());
    return 1;
  }
  return 0;
}
