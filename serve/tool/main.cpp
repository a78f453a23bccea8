// te-serve: the te-encoder classifier, a Hugging Face sentence embedding model, or a decoder
// model behind HTTP (see serve/README.md). The server, its route sets and the protocols are the
// te::serve library; this program reads the command line, loads the model and runs the one server
// its kind enables.
//
//   te-serve --load ckpt --port 8080
//   curl -s localhost:8080/v1/classify -d '{"sentences": ["The cat sat on the mat."]}'
//   te-serve --model models/all-MiniLM-L6-v2/ --port 8080
//   curl -s localhost:8080/v1/embeddings -d '{"input": ["The cat sat on the mat."]}'

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>

#include "args.h"
#include "programs.h"
#include "te/encoder/data.h"
#include "te/error.h"
#include "te/nn/inference.h"
#include "te/runtime/runtime.h"
#include "te/serve/routes.h"

namespace te_serve {
namespace {

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Classifies a CoLA TSV in batches and prints the accuracy (the numbers te-encoder prints).
int evaluate(const te::serve::Classifier& classifier, const std::string& path, int64_t batch) {
  const auto examples = encoder::read_cola_tsv(path);
  int64_t correct = 0, tp = 0, tn = 0, fp = 0, fn = 0;
  for (std::size_t start = 0; start < examples.size(); start += static_cast<std::size_t>(batch)) {
    const std::size_t end = std::min(examples.size(), start + static_cast<std::size_t>(batch));
    std::vector<std::string> sentences;
    for (std::size_t i = start; i < end; ++i) sentences.push_back(examples[i].sentence);
    const te::serve::Classification c = classifier.classify(sentences);
    for (std::size_t i = start; i < end; ++i) {
      const int64_t label = examples[i].label, pred = c.labels[i - start];
      correct += label == pred;
      tp += pred == 1 && label == 1;
      tn += pred == 0 && label == 0;
      fp += pred == 1 && label == 0;
      fn += pred == 0 && label == 1;
    }
  }
  std::printf("eval %s: %zu sentences, accuracy %.4f, mcc %.4f (%s weights)\n", path.c_str(),
              examples.size(), double(correct) / static_cast<double>(examples.size()),
              encoder::matthews(tp, tn, fp, fn), classifier.fp8_weights() ? "fp8" : "fp32");
  return 0;
}

// The non-empty lines of `file` (--calibration).
std::vector<std::string> read_lines(const std::string& file) {
  std::ifstream in(file);
  if (!in) throw encoder::InputError("--calibration: cannot read '" + file + "'");
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  if (lines.empty()) throw encoder::InputError("--calibration: '" + file + "' holds no lines");
  return lines;
}

// The model's name in responses: the file or folder's.
std::string name_of(const std::string& path) {
  const std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  return p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
}

// --model is a decoder (a GGUF file, or a folder that is not a sentence-transformers one).
bool is_decoder(const std::string& path) {
  return std::filesystem::is_regular_file(path) ||
         !std::filesystem::exists(std::filesystem::path(path) / "modules.json");
}

// A sentence model's errors in its options: the message, or "" when they fit.
std::string sentence_model_misuse(const Args& args, const CLI::App& app) {
  for (const char* option : kDecoderOptions) {
    if (app.count(option) > 0) {
      return std::string(option) +
             " is for a decoder model (--model FILE.gguf or a causal LM folder); " +
             (args.model_dir.empty() ? "--load" : args.model_dir) + " is not one";
    }
  }
  if (!args.model_dir.empty()) {
    if (!args.export_fp8.empty() || !args.eval_tsv.empty()) {
      return "--export-fp8 and --eval take a te-encoder checkpoint (--load), not --model";
    }
    if (args.fp8_weights != !args.calibration.empty()) {
      return "with --model, --fp8-weights needs --calibration FILE (text like the requests', to "
             "calibrate the FP8 input scales) and --calibration needs --fp8-weights";
    }
  } else if (!args.calibration.empty()) {
    return "--calibration goes with --model (a --load checkpoint holds its calibrated input "
           "scales)";
  }
  return "";
}

// A decoder model's errors in its options: the message, or "" when they fit.
std::string decoder_misuse(const Args& args) {
  if (!args.export_fp8.empty() || !args.eval_tsv.empty() || args.fp8_weights ||
      !args.calibration.empty()) {
    return "--export-fp8, --eval, --fp8-weights and --calibration take a te-encoder checkpoint "
           "or an embedding model, not a decoder (" +
           args.model_dir + ")";
  }
  if (args.max_num_batched_tokens < args.max_num_seqs) {
    return "--max-num-batched-tokens " + std::to_string(args.max_num_batched_tokens) +
           " is below --max-num-seqs " + std::to_string(args.max_num_seqs) +
           ": every running sequence's next token must fit in a step";
  }
  if (args.nproc == 1 &&
      (!args.mesh.empty() || !args.mesh_resource.empty() || !args.rules.empty())) {
    return "--mesh, --mesh-resource and --rules need --nproc > 1";
  }
  return "";
}

// --model with modules.json: a sentence embedding model behind POST /v1/embeddings.
int run_embedder(const Args& args, std::chrono::steady_clock::time_point start,
                 int64_t resident_before) {
  te::hf::SentenceEmbedder embedder(args.model_dir);
  if (args.fp8_weights) embedder.freeze_fp8_weights(read_lines(args.calibration));
  std::printf(
      "te-serve: loaded %s in %.2f s: %lld-dimensional embeddings, %s pooling%s, "
      "at most %lld tokens, %s weights %.1f MiB, resident %.1f MiB (%+.1f MiB for "
      "loading)\n",
      args.model_dir.c_str(),
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
      static_cast<long long>(embedder.dimensions()), embedder.pooling().c_str(),
      embedder.normalize() ? ", normalized" : "", static_cast<long long>(embedder.max_length()),
      args.fp8_weights ? "fp8" : "fp32", mib(te::nn::resident_bytes(*embedder.encoder())),
      mib(te::serve::resident_bytes()), mib(te::serve::resident_bytes() - resident_before));
  std::fflush(stdout);
  return serve_sentences(args, nullptr, &embedder);
}

// --load: a te-encoder checkpoint's classifier behind POST /v1/classify, or --eval, --export-fp8.
int run_classifier(const Args& args, std::chrono::steady_clock::time_point start,
                   int64_t resident_before) {
  const te::serve::Classifier classifier(args.load_dir,
                                         args.fp8_weights || !args.export_fp8.empty());
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t resident = te::serve::resident_bytes();
  std::printf(
      "te-serve: loaded %s in %.2f s: weights %.2f MiB (%s), checkpoint %.2f MiB, "
      "resident %.1f MiB (%+.1f MiB for loading)\n",
      args.load_dir.c_str(), load_s, mib(classifier.weight_bytes()),
      classifier.fp8_weights() ? "fp8" : "fp32", mib(classifier.checkpoint_bytes()), mib(resident),
      mib(resident - resident_before));
  std::fflush(stdout);
  if (!args.export_fp8.empty()) {
    classifier.save(args.export_fp8);
    std::printf("te-serve: wrote %s\n", args.export_fp8.c_str());
    return 0;
  }
  if (!args.eval_tsv.empty()) return evaluate(classifier, args.eval_tsv, args.max_batch);
  return serve_sentences(args, &classifier, nullptr);
}

int run(Args& args, const CLI::App& app) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t resident_before = te::serve::resident_bytes();
  const bool decoder = !args.model_dir.empty() && is_decoder(args.model_dir);
  const std::string misuse = decoder ? decoder_misuse(args) : sentence_model_misuse(args, app);
  if (!misuse.empty()) {
    std::cerr << "te-serve: error: " << misuse << std::endl;
    return 2;
  }
  // The names the model answers to: --served-model-name, else its file or folder's name.
  for (const std::string& n : args.served_model_names) {
    if (n.empty()) {
      std::cerr << "te-serve: error: --served-model-name: an empty name; give each a name"
                << std::endl;
      return 2;
    }
  }
  te::serve::ModelNames& models = args.server.models;
  models.given = !args.served_model_names.empty();
  models.names = models.given ? args.served_model_names
                              : std::vector<std::string>{name_of(
                                    args.model_dir.empty() ? args.load_dir : args.model_dir)};
  models.created = static_cast<int64_t>(std::time(nullptr));
  if (decoder) return serve_generation(args);
  if (!args.model_dir.empty()) return run_embedder(args, start, resident_before);
  return run_classifier(args, start, resident_before);
}

}  // namespace
}  // namespace te_serve

int main(int argc, char** argv) {
  te::keep_freed_memory();  // steps reuse freed memory (te/runtime/runtime.h)
  // Before any thread starts, so every thread inherits the mask (te/serve/server.h).
  te::serve::block_stop_signals();
  te_serve::Args args;
  CLI::App app{
      "te-serve: serves the classifier of a te-encoder checkpoint (--load), a Hugging Face\n"
      "sentence embedding model (--model DIR with modules.json: e.g. all-MiniLM-L6-v2), or a\n"
      "decoder model (--model FILE.gguf or a causal LM folder: e.g. SmolLM2) over HTTP.\n"
      "  POST /v1/classify {\"sentences\": [\"...\"]} -> {\"labels\", \"probabilities\", "
      "\"truncated\"}\n"
      "  POST /v1/embeddings {\"input\": \"...\" | [\"...\"], \"encoding_format\": \"float\" | "
      "\"base64\"} -> OpenAI's embeddings response (and \"truncated\")\n"
      "  POST /v1/completions, POST /v1/chat/completions: OpenAI's, \"stream\": true as "
      "server-sent\n"
      "    events; fields: max_tokens, temperature, top_p, top_k, min_p, repetition_penalty, "
      "seed,\n"
      "    presence_penalty, frequency_penalty, stop, stop_token_ids, ignore_eos, logprobs "
      "(chat:\n"
      "    logprobs, top_logprobs), stream_options.include_usage; n, best_of > 1, echo, "
      "suffix,\n"
      "    tools: 400. A sampling field left out takes the model's default (its\n"
      "    generation_config.json or GGUF general.sampling.* keys), else llama.cpp's\n"
      "    (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05); te-serve prints them at start.\n"
      "  GET /v1/models, GET /v1/models/NAME: OpenAI's model list (--served-model-name's names)\n"
      "  GET /health (or /healthz), GET /metrics (Prometheus text)\n"
      "Classify and embeddings requests are batched dynamically; generation requests are decoded\n"
      "together with continuous batching over a paged KV cache. SIGTERM stops taking requests,\n"
      "finishes in-flight ones (generation: within --drain-timeout) and exits 0."};
  app.footer(te::nn::cpu_gemm_summary());
  te_serve::add_options(app, args);
  CLI11_PARSE(app, argc, argv);
  if (args.load_dir.empty() && args.model_dir.empty()) {
    std::cerr << "te-serve: error: give --load CHECKPOINT (classify) or --model DIR (embeddings)"
              << std::endl;
    return 2;
  }
  try {
    return te_serve::run(args, app);
  } catch (const encoder::InputError& e) {
    std::cerr << "te-serve: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {  // te::Error, or a library's own (e.g. bad_alloc)
    std::cerr << "te-serve: error: " << e.what() << std::endl;
    return 2;
  }
}
