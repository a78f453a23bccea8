// te-serve: the te-encoder classifier, or a Hugging Face sentence embedding model, behind HTTP,
// with dynamic batching (see README.md).
//
//   te-serve --load ckpt --port 8080
//   curl -s localhost:8080/v1/classify -d '{"sentences": ["The cat sat on the mat."]}'
//   te-serve --model all-MiniLM-L6-v2/ --port 8080
//   curl -s localhost:8080/v1/embeddings -d '{"input": ["The cat sat on the mat."]}'

#include <httplib.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include "batcher.h"
#include "data.h"
#include "service.h"
#include "te/error.h"
#include "te/hf/sentence.h"
#include "te/nn/inference.h"

namespace {

struct Args {
  std::string load_dir;
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8080;
  int workers = 1;
  int64_t max_batch = 32;
  double max_wait_ms = 5;
  int64_t max_queue = 256;
  int64_t max_request_sentences = 0;  // 0: 8 x max_batch
  std::size_t max_body_bytes = std::size_t{1} << 20;
  int http_threads = 128;
  int threads_per_worker = 0;
  bool fp8_weights = false;
  std::string calibration;
  std::string export_fp8;
  std::string eval_tsv;
};

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

// Classifies a CoLA TSV in batches and prints the accuracy (the numbers te-encoder prints).
int evaluate(const serve::Classifier& classifier, const std::string& path, int64_t batch) {
  const auto examples = encoder::read_cola_tsv(path);
  int64_t correct = 0, tp = 0, tn = 0, fp = 0, fn = 0;
  for (std::size_t start = 0; start < examples.size(); start += static_cast<std::size_t>(batch)) {
    const std::size_t end = std::min(examples.size(), start + static_cast<std::size_t>(batch));
    std::vector<std::string> sentences;
    for (std::size_t i = start; i < end; ++i) sentences.push_back(examples[i].sentence);
    const serve::Classification c = classifier.classify(sentences);
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

// What te-serve serves: the classifier of a te-encoder checkpoint (--load) or a sentence
// embedding model (--model).
struct Service {
  const serve::Classifier* classifier = nullptr;
  const te::hf::SentenceEmbedder* embedder = nullptr;
  std::string model_name;  // the "model" of embeddings responses: the folder's name
};

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

// The Embeddings of `sentences` (one model call).
serve::Embeddings embed(const te::hf::SentenceEmbedder& embedder,
                        const std::vector<std::string>& sentences) {
  te::hf::SentenceEmbedder::Info info;
  serve::Embeddings e;
  e.vectors = embedder.embed(sentences, 0, &info);
  e.tokens = std::move(info.tokens);
  e.truncated = std::move(info.truncated);
  return e;
}

int serve_http(const Service& service, const Args& args) {
  serve::Metrics metrics;
  metrics.set_gauge("te_serve_weight_bytes", "Bytes of the model's parameters and buffers.",
                    static_cast<double>(
                        service.classifier ? service.classifier->weight_bytes()
                                           : te::nn::resident_bytes(*service.embedder->encoder())));
  if (service.classifier) {
    metrics.set_gauge("te_serve_checkpoint_bytes", "Bytes of the loaded checkpoint's data files.",
                      static_cast<double>(service.classifier->checkpoint_bytes()));
  }
  serve::BatcherOptions options;
  options.workers = args.workers;
  options.max_batch = args.max_batch;
  options.max_wait_ms = args.max_wait_ms;
  options.max_queue = args.max_queue;
  options.threads_per_worker = args.threads_per_worker;
  // One batcher, for the one model this server holds.
  std::optional<serve::Batcher<serve::Classification>> classify;
  std::optional<serve::Batcher<serve::Embeddings>> embeddings;
  if (service.classifier) {
    const serve::Classifier& c = *service.classifier;
    classify.emplace([&c](const std::vector<std::string>& s) { return c.classify(s); }, options,
                     metrics);
  } else {
    const te::hf::SentenceEmbedder& e = *service.embedder;
    embeddings.emplace([&e](const std::vector<std::string>& s) { return embed(e, s); }, options,
                       metrics);
  }
  auto drain = [&] { classify ? classify->drain() : embeddings->drain(); };
  auto stop = [&] { classify ? classify->stop() : embeddings->stop(); };
  const std::string endpoint = classify ? "POST /v1/classify" : "POST /v1/embeddings";
  const std::size_t max_sentences = static_cast<std::size_t>(
      args.max_request_sentences > 0 ? args.max_request_sentences : 8 * args.max_batch);

  httplib::Server server;
  const int pool = args.http_threads;
  server.new_task_queue = [pool] {
    return new httplib::ThreadPool(static_cast<std::size_t>(pool));
  };
  server.set_payload_max_length(args.max_body_bytes);
  server.set_keep_alive_max_count(1000);
  // Headers and body go out in two writes; with Nagle on, the second waits for the client's
  // delayed ACK (40 ms on Linux).
  server.set_tcp_nodelay(true);
  auto json_error = [](httplib::Response& res, int status, const std::string& message) {
    res.status = status;
    res.set_content(serve::error_body(message), "application/json");
  };
  // A request's answer, or its error as JSON with its status (503 with Retry-After).
  auto answer = [&](httplib::Response& res, const char* what, auto&& body_of) {
    const auto start = std::chrono::steady_clock::now();
    try {
      res.set_content(body_of(), "application/json");
    } catch (const serve::HttpError& e) {
      json_error(res, e.status, e.what());
      if (e.status == 503) res.set_header("Retry-After", "1");
    } catch (const std::exception& e) {
      json_error(res, 500, std::string(what) + " failed: " + e.what());
    }
    metrics.latency(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  };
  if (classify) {
    server.Post("/v1/classify", [&](const httplib::Request& req, httplib::Response& res) {
      answer(res, "classification", [&] {
        auto a = classify->submit(serve::decode_classify(req.body, max_sentences));
        return serve::encode_classification(a.get());
      });
    });
  } else {
    server.Post("/v1/embeddings", [&](const httplib::Request& req, httplib::Response& res) {
      answer(res, "embedding", [&] {
        serve::EmbeddingsRequest r =
            serve::decode_embeddings(req.body, max_sentences, service.embedder->dimensions());
        auto a = embeddings->submit(std::move(r.input));
        return serve::encode_embeddings(a.get(), r.base64, service.model_name);
      });
    });
  }
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  server.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
    metrics.set_gauge("te_serve_resident_bytes", "Resident memory of the process (VmRSS).",
                      static_cast<double>(serve::resident_bytes()));
    res.set_content(metrics.render(), "text/plain; version=0.0.4");
  });
  server.set_error_handler([&](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 413) {
      json_error(res, 413,
                 "the body is over " + std::to_string(args.max_body_bytes) +
                     " bytes (--max-body-bytes); split the request");
    } else if (res.status == 404) {
      json_error(res, 404,
                 "no endpoint " + req.method + " " + req.path + "; use " + endpoint +
                     ", GET /healthz or GET /metrics");
    } else {
      json_error(res, res.status,
                 "the request could not be served (HTTP " + std::to_string(res.status) + ")");
    }
  });
  server.set_logger([&](const httplib::Request& req, const httplib::Response& res) {
    metrics.request(req.path, res.status);
  });

  // The listening socket: SO_REUSEADDR only (httplib's default adds SO_REUSEPORT, under which a
  // second server binds the same port without an error), and a deep accept queue (httplib
  // listens with a backlog of 5, so a burst of connections loses SYNs and waits 1 s to retry).
  std::atomic<int> listen_fd{-1};
  server.set_socket_options([&listen_fd](socket_t sock) {
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = sock;
  });
  int port = args.port;
  if (port == 0) {
    port = server.bind_to_any_port(args.host);
  } else if (!server.bind_to_port(args.host, port)) {
    port = -1;
  }
  if (port < 0) {
    std::cerr << "te-serve: error: cannot listen on " << args.host << ":" << args.port
              << " (in use, or not an address of this machine); choose another --host/--port"
              << std::endl;
    return 2;
  }
  if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);

  // SIGTERM/SIGINT: stop accepting, answer what is in flight, exit 0. The signals are blocked in
  // every thread and taken by one waiting thread, so nothing runs in a signal handler.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    int sig = 0;
    while (sigwait(&signals, &sig) == 0) {
      if (done.load() || sig == SIGTERM || sig == SIGINT) break;
    }
    if (!done.load()) {
      std::cout << "te-serve: " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
                << ": draining in-flight requests" << std::endl;
    }
    drain();  // gathering batches run now; server.stop() waits for their answers
    server.stop();
  });

  std::cout << "te-serve: listening on http://" << args.host << ":" << port << " (" << args.workers
            << " worker" << (args.workers == 1 ? "" : "s") << ", max batch " << args.max_batch
            << ", max wait " << args.max_wait_ms << " ms, queue " << args.max_queue << ")"
            << std::endl;
  const bool ok = server.listen_after_bind();
  // The HTTP threads have finished their requests; the batcher answers anything still queued.
  stop();
  done.store(true);
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  std::cout << "te-serve: stopped" << std::endl;
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Block the stop signals before any thread starts, so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Args args;
  CLI::App app{
      "te-serve: serves the classifier of a te-encoder checkpoint (--load), or a Hugging Face\n"
      "sentence embedding model (--model: e.g. all-MiniLM-L6-v2), over HTTP.\n"
      "  POST /v1/classify {\"sentences\": [\"...\"]} -> {\"labels\", \"probabilities\", "
      "\"truncated\"}\n"
      "  POST /v1/embeddings {\"input\": \"...\" | [\"...\"], \"encoding_format\": \"float\" | "
      "\"base64\"} -> OpenAI's embeddings response (and \"truncated\")\n"
      "  GET /healthz, GET /metrics (Prometheus text)\n"
      "Requests from all connections are batched dynamically and run under c10::InferenceMode;\n"
      "SIGTERM stops accepting, answers in-flight requests and exits 0."};
  auto* load = app.add_option("--load", args.load_dir,
                              "Checkpoint directory written by te-encoder --save (any layout), "
                              "or by te-serve --export-fp8: serves POST /v1/classify");
  auto* model = app.add_option("--model", args.model_dir,
                               "A Hugging Face sentence-transformers folder (config.json, "
                               "model.safetensors, tokenizer.json, modules.json, 1_Pooling/; "
                               "e.g. all-MiniLM-L6-v2): serves POST /v1/embeddings");
  load->excludes(model);
  model->excludes(load);
  app.add_option("--host", args.host, "Address to listen on")->capture_default_str();
  app.add_option("--port", args.port, "Port (0: any free port, printed at start)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  app.add_option("--workers", args.workers, "Model workers (each runs one batch at a time)")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--max-batch", args.max_batch, "Sentences per model call")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--max-wait-ms", args.max_wait_ms,
                 "How long a batch waits for more requests after its first")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 10000.0));
  app.add_option("--max-queue", args.max_queue,
                 "Requests waiting for a worker; more are answered 503 with Retry-After")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--max-request-sentences", args.max_request_sentences,
                 "Sentences one request may hold (more: 413); default 8 x --max-batch")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--max-body-bytes", args.max_body_bytes, "Largest request body (more: 413)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{64}, std::size_t{1} << 30));
  app.add_option("--http-threads", args.http_threads,
                 "Connection threads (a keep-alive connection holds one)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--threads-per-worker", args.threads_per_worker,
                 "Intra-op threads of each worker (default: cores / workers)")
      ->check(CLI::Range(1, 1024));
  app.add_flag("--fp8-weights", args.fp8_weights,
               "Hold the weights as FP8 (E4M3 codes and a scale: a quarter of fp32's bytes): the "
               "GEMMs run in FP8 with the checkpoint's calibrated input scales (--model: "
               "calibrated on --calibration's lines), embedding rows are decoded as they are "
               "looked up");
  app.add_option("--calibration", args.calibration,
                 "With --model and --fp8-weights: text lines like the requests' (one per line), "
                 "run through the model first to calibrate the FP8 input scales");
  app.add_option("--export-fp8", args.export_fp8,
                 "Write the model with FP8 weights as a checkpoint here and exit (te-serve "
                 "--load loads it as FP8)");
  app.add_option("--eval", args.eval_tsv,
                 "Classify a CoLA TSV file, print accuracy and MCC, and exit (no server)");
  CLI11_PARSE(app, argc, argv);

  if (args.load_dir.empty() && args.model_dir.empty()) {
    std::cerr << "te-serve: error: give --load CHECKPOINT (classify) or --model DIR (embeddings)"
              << std::endl;
    return 2;
  }
  try {
    const auto start = std::chrono::steady_clock::now();
    const int64_t resident_before = serve::resident_bytes();
    if (!args.model_dir.empty()) {
      if (!args.export_fp8.empty() || !args.eval_tsv.empty()) {
        std::cerr << "te-serve: error: --export-fp8 and --eval take a te-encoder checkpoint "
                     "(--load), not --model"
                  << std::endl;
        return 2;
      }
      if (args.fp8_weights != !args.calibration.empty()) {
        std::cerr << "te-serve: error: with --model, --fp8-weights needs --calibration FILE (text "
                     "like the requests', to calibrate the FP8 input scales) and --calibration "
                     "needs --fp8-weights"
                  << std::endl;
        return 2;
      }
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
          mib(serve::resident_bytes()), mib(serve::resident_bytes() - resident_before));
      std::fflush(stdout);
      std::string name = std::filesystem::path(args.model_dir).lexically_normal().filename();
      if (name.empty()) {
        name = std::filesystem::path(args.model_dir).lexically_normal().parent_path().filename();
      }
      return serve_http({nullptr, &embedder, name}, args);
    }
    if (!args.calibration.empty()) {
      std::cerr << "te-serve: error: --calibration goes with --model (a --load checkpoint holds "
                   "its calibrated input scales)"
                << std::endl;
      return 2;
    }
    const serve::Classifier classifier(args.load_dir, args.fp8_weights || !args.export_fp8.empty());
    const double load_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const int64_t resident = serve::resident_bytes();
    std::printf(
        "te-serve: loaded %s in %.2f s: weights %.2f MiB (%s), checkpoint %.2f MiB, "
        "resident %.1f MiB (%+.1f MiB for loading)\n",
        args.load_dir.c_str(), load_s, mib(classifier.weight_bytes()),
        classifier.fp8_weights() ? "fp8" : "fp32", mib(classifier.checkpoint_bytes()),
        mib(resident), mib(resident - resident_before));
    std::fflush(stdout);
    if (!args.export_fp8.empty()) {
      classifier.save(args.export_fp8);
      std::printf("te-serve: wrote %s\n", args.export_fp8.c_str());
      return 0;
    }
    if (!args.eval_tsv.empty()) return evaluate(classifier, args.eval_tsv, args.max_batch);
    return serve_http({&classifier, nullptr, ""}, args);
  } catch (const encoder::InputError& e) {
    std::cerr << "te-serve: error: " << e.what() << std::endl;
    return 2;
  } catch (const te::Error& e) {
    std::cerr << "te-serve: error: " << e.what() << std::endl;
    return 2;
  } catch (const std::exception& e) {  // a library's own exception, e.g. bad_alloc
    std::cerr << "te-serve: error: " << e.what() << std::endl;
    return 2;
  }
}
