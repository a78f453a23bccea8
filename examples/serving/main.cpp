// te-serve: the te-encoder classifier, or a Hugging Face sentence embedding model, behind HTTP,
// with dynamic batching (see README.md).
//
//   te-serve --load ckpt --port 8080
//   curl -s localhost:8080/v1/classify -d '{"sentences": ["The cat sat on the mat."]}'
//   te-serve --model models/all-MiniLM-L6-v2/ --port 8080
//   curl -s localhost:8080/v1/embeddings -d '{"input": ["The cat sat on the mat."]}'

#include <pthread.h>
#include <signal.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>

#include "batcher.h"
#include "data.h"
#include "generation.h"
#include "http.h"
#include "service.h"
#include "te/distributed.h"
#include "te/error.h"
#include "te/hf/ranks.h"
#include "te/hf/sentence.h"
#include "te/nn/inference.h"
#include "te/runtime/runtime.h"

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
  int64_t max_connections = 0;  // 0: as many as the open-file limit allows, at most 4096
  double header_timeout_s = 10, body_timeout_s = 30, keep_alive_timeout_s = 30,
         write_timeout_s = 30;
  int threads_per_worker = 0;
  bool fp8_weights = false;
  std::string calibration;
  std::string export_fp8;
  std::string eval_tsv;
  // A decoder model (--model GGUF or a causal LM folder).
  int64_t max_num_seqs = 32;
  int64_t max_num_batched_tokens = 512;
  int64_t max_sequence_length = 0;
  int64_t kv_cache_mib = 0;
  int64_t page_size = 16;
  bool contiguous = false;
  bool dequantize_gguf = false;
  double drain_timeout_s = 30;
  int nproc = 1;
  std::string mesh, mesh_resource, rules;
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

// The HTTP server every mode shares (http.h): connections, deadlines and body limit from the
// command line, GET /healthz and GET /metrics, a JSON error for what no handler answers (`error_of`
// writes it), the request counter.
std::unique_ptr<serve::http::Server> make_server(
    const Args& args, serve::Metrics& metrics, const std::string& endpoints,
    std::function<std::string(int, const std::string&)> error_of) {
  using std::chrono::milliseconds;
  auto ms = [](double s) { return milliseconds(static_cast<int64_t>(s * 1000.0)); };
  serve::http::ServerOptions o;
  o.host = args.host;
  o.port = args.port;
  o.worker_threads = args.http_threads;
  o.max_connections = args.max_connections;
  o.max_body_bytes = args.max_body_bytes;
  o.header_timeout = ms(args.header_timeout_s);
  o.body_timeout = ms(args.body_timeout_s);
  o.keep_alive_timeout = ms(args.keep_alive_timeout_s);
  o.write_timeout = ms(args.write_timeout_s);
  o.error_body = std::move(error_of);
  o.endpoints = endpoints;
  o.metrics = &metrics;
  auto server = std::make_unique<serve::http::Server>(std::move(o));
  server->route(
      "GET", "/healthz",
      [](const serve::http::Request&, serve::http::Reply reply) {
        serve::http::Response r;
        r.body = "{\"status\":\"ok\"}";
        reply.send(std::move(r));
      },
      serve::http::Server::Run::kInline);  // answered while every worker waits
  server->route(
      "GET", "/metrics",
      [&metrics](const serve::http::Request&, serve::http::Reply reply) {
        metrics.set_gauge("te_serve_resident_bytes", "Resident memory of the process (VmRSS).",
                          static_cast<double>(serve::resident_bytes()));
        serve::http::Response r;
        r.content_type = "text/plain; version=0.0.4";
        r.body = metrics.render();
        reply.send(std::move(r));
      },
      serve::http::Server::Run::kInline);
  return server;
}

// Listens on --host/--port: the port, or -1 (printed) when it cannot.
int bind(serve::http::Server& server) {
  try {
    return server.bind();
  } catch (const te::Error& e) {
    std::cerr << "te-serve: error: " << e.what() << std::endl;
    return -1;
  }
}

// Waits for SIGTERM/SIGINT on its own thread (the signals are blocked in every thread, so nothing
// runs in a signal handler) and then calls `on_signal`; dismiss() ends the wait without it.
class SignalWaiter {
 public:
  explicit SignalWaiter(std::function<void()> on_signal)
      : thread_([this, on_signal = std::move(on_signal)] {
          sigset_t signals;
          sigemptyset(&signals);
          sigaddset(&signals, SIGTERM);
          sigaddset(&signals, SIGINT);
          int sig = 0;
          while (sigwait(&signals, &sig) == 0) {
            if (done_.load() || sig == SIGTERM || sig == SIGINT) break;
          }
          if (done_.load()) return;
          std::cout << "te-serve: " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
                    << ": draining in-flight requests" << std::endl;
          on_signal();
        }) {}
  ~SignalWaiter() { dismiss(); }
  void dismiss() {
    if (!thread_.joinable()) return;
    done_.store(true);
    pthread_kill(thread_.native_handle(), SIGTERM);
    thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

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

  auto server = make_server(args, metrics, endpoint, [](int, const std::string& message) {
    return serve::error_body(message);
  });
  // A request's answer, or its error as JSON with its status (503 with Retry-After).
  auto answer = [&metrics](const char* what, auto&& body_of) {
    const auto start = std::chrono::steady_clock::now();
    serve::http::Response r;
    try {
      r.body = body_of();
    } catch (const serve::HttpError& e) {
      r.status = e.status;
      r.body = serve::error_body(e.what());
      if (e.status == 503) r.headers.emplace_back("Retry-After", "1");
    } catch (const std::exception& e) {
      r.status = 500;
      r.body = serve::error_body(std::string(what) + " failed: " + e.what());
    }
    metrics.latency(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return r;
  };
  // Each request waits for its batch on one of the --http-threads workers.
  if (classify) {
    server->route("POST", "/v1/classify",
                  [&](const serve::http::Request& req, serve::http::Reply reply) {
                    reply.send(answer("classification", [&] {
                      auto a = classify->submit(serve::decode_classify(req.body, max_sentences));
                      return serve::encode_classification(a.get());
                    }));
                  });
  } else {
    server->route(
        "POST", "/v1/embeddings", [&](const serve::http::Request& req, serve::http::Reply reply) {
          reply.send(answer("embedding", [&] {
            serve::EmbeddingsRequest r =
                serve::decode_embeddings(req.body, max_sentences, service.embedder->dimensions());
            auto a = embeddings->submit(std::move(r.input));
            return serve::encode_embeddings(a.get(), r.base64, service.model_name);
          }));
        });
  }
  const int port = bind(*server);
  if (port < 0) return 2;
  // SIGTERM/SIGINT: stop accepting, answer what is in flight (within --drain-timeout), exit 0.
  SignalWaiter waiter([&] {
    drain();  // gathering batches run now
    server->shutdown(std::chrono::milliseconds(static_cast<int64_t>(args.drain_timeout_s * 1000)));
  });
  std::cout << "te-serve: listening on http://" << args.host << ":" << port << " (" << args.workers
            << " worker" << (args.workers == 1 ? "" : "s") << ", max batch " << args.max_batch
            << ", max wait " << args.max_wait_ms << " ms, queue " << args.max_queue << ")"
            << std::endl;
  server->run();
  // The connections have closed; the batcher answers anything still queued.
  stop();
  waiter.dismiss();
  server.reset();  // the workers finish
  std::cout << "te-serve: stopped" << std::endl;
  return 0;
}

// ---- a decoder model: OpenAI's completions over the generation engine ----------------------

// POST /v1/completions and /v1/chat/completions on `server`, answered by `generator`. A stream
// pins no thread: the worker that takes the request submits it, and from then on the generator's
// scheduler tells the connection when output is waiting (GenerationStream::listen), which reads it
// and writes it on the connection's thread; a client that goes cancels its request.
void add_generation_routes(serve::http::Server& server, serve::Generator& generator) {
  using serve::http::Reply;
  auto handle = [&generator](bool chat) {
    return [&generator, chat](const serve::http::Request& req, Reply reply) {
      try {
        const serve::CompletionRequest r = serve::decode_completion(req.body, chat);
        std::shared_ptr<serve::GenerationStream> stream = generator.submit(r);
        const std::string model = generator.model_name();  // the one that answers
        // A client that goes cancels its request (its pages are freed at the next step) and
        // stops the stream's listening (which holds this reply: the two would hold each other).
        reply.on_gone([stream] {
          stream->cancel();
          stream->unlisten();
        });
        std::function<void()> read;
        if (!r.stream) {
          struct Whole {
            std::string text;
            std::vector<serve::TokenInfo> tokens;
          };
          read = [stream, model, reply, whole = std::make_shared<Whole>()] {
            serve::Piece piece;
            while (stream->next(piece, std::chrono::milliseconds(0))) {
              whole->text += piece.text;
              whole->tokens.insert(whole->tokens.end(), piece.tokens.begin(), piece.tokens.end());
              if (piece.finish_reason.empty()) continue;
              serve::http::Response res;
              res.body = serve::encode_response(*stream, model, whole->text, whole->tokens,
                                                piece.finish_reason);
              reply.send(std::move(res));
              return;
            }
          };
        } else {
          serve::http::Response head;
          head.content_type = "text/event-stream";
          head.headers.emplace_back("Cache-Control", "no-cache");
          reply.open_stream(std::move(head));
          read = [stream, model, reply, first = std::make_shared<bool>(true)]() mutable {
            serve::Piece piece;
            while (stream->next(piece, std::chrono::milliseconds(0))) {
              std::string out;
              if (*first && stream->request().chat) {
                // A chat stream opens with the role alone (OpenAI's first chunk), whatever the
                // first piece holds: pieces may carry several tokens when the client reads late.
                out = serve::encode_event(*stream, model, serve::Piece{}, true);
                *first = false;
              }
              if (piece.text.empty() && piece.tokens.empty() && piece.finish_reason.empty() &&
                  !*first) {
                if (!out.empty()) reply.write(std::move(out));
                continue;  // a held-back character: nothing more to send yet
              }
              out += serve::encode_event(*stream, model, piece, *first);
              *first = false;
              const bool last = !piece.finish_reason.empty();
              if (last) {
                if (stream->request().include_usage) {
                  out += serve::encode_event(*stream, model, piece, false, true);
                }
                out += "data: [DONE]\n\n";
              }
              reply.write(std::move(out));
              if (last) {
                reply.end();
                return;
              }
            }
          };
        }
        stream->listen([reply, read]() mutable { reply.post(read); });
      } catch (const serve::HttpError& e) {
        serve::http::Response res;
        res.status = e.status;
        res.body = serve::openai_error_body(e.status, e.what(), e.param);
        if (e.status == 503) res.headers.emplace_back("Retry-After", "1");
        reply.send(std::move(res));
      } catch (const std::exception& e) {
        serve::http::Response res;
        res.status = 500;
        res.body = serve::openai_error_body(500, std::string("generation failed: ") + e.what(), "");
        reply.send(std::move(res));
      }
    };
  };
  server.route("POST", "/v1/completions", handle(false));
  server.route("POST", "/v1/chat/completions", handle(true));
}

// The HTTP side of a generation server, on its own thread: returns once SIGTERM's drain is done
// (or the server failed) and the generator has been stopped.
class GenerationHttp {
 public:
  GenerationHttp(serve::Generator& generator, serve::Metrics& metrics, const Args& args)
      : generator_(generator),
        args_(args),
        server_(make_server(args, metrics, "POST /v1/completions, POST /v1/chat/completions",
                            [](int status, const std::string& message) {
                              return serve::openai_error_body(status, message, "");
                            })) {
    add_generation_routes(*server_, generator);
  }
  // Binds and serves on a thread; false (printed) when the port cannot be had.
  bool start() {
    const int port = bind(*server_);
    if (port < 0) return false;
    std::cout << "te-serve: listening on http://" << args_.host << ":" << port
              << " (POST /v1/completions, POST /v1/chat/completions; max " << args_.max_num_seqs
              << " sequences, " << args_.max_num_batched_tokens << " tokens per step, queue "
              << args_.max_queue << ")" << std::endl;
    thread_ = std::thread([this] { server_->run(); });
    // SIGTERM/SIGINT: new requests are refused (503), running streams finish within the drain
    // timeout and the rest end with finish_reason "abort"; then the server stops.
    waiter_ = std::make_unique<SignalWaiter>([this] {
      generator_.drain();
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::duration<double>(args_.drain_timeout_s);
      while (!generator_.idle() && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      generator_.stop();
    });
    return true;
  }
  // After the generator's run() has returned: the streams write their last events (for up to
  // 2 s), then the connections close and the server stops.
  void join() {
    server_->shutdown(std::chrono::seconds(2));
    if (thread_.joinable()) thread_.join();
    if (waiter_) waiter_->dismiss();
  }

 private:
  serve::Generator& generator_;
  const Args& args_;
  std::unique_ptr<serve::http::Server> server_;
  std::thread thread_;
  std::unique_ptr<SignalWaiter> waiter_;
};

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

// Rank 0's commands to the other ranks over `mesh`.
serve::Broadcast broadcast_over(const te::DeviceMesh& mesh) {
  return [&mesh](const std::string& bytes) { return mesh.broadcast(bytes, 0); };
}

int serve_generation(const Args& args) {
  const auto start = std::chrono::steady_clock::now();
  const bool gguf = std::filesystem::is_regular_file(args.model_dir);
  const te::hf::Tokenizer tokenizer = gguf ? te::hf::Tokenizer::from_file(args.model_dir)
                                           : te::hf::Tokenizer::from_pretrained(args.model_dir);
  const te::hf::GenerationDefaults defaults = te::hf::read_generation_defaults(args.model_dir);
  serve::GeneratorOptions options;
  options.model_name = name_of(args.model_dir);
  options.max_waiting = args.max_queue;
  te::hf::EngineOptions& e = options.engine;
  e.max_num_seqs = args.max_num_seqs;
  e.max_num_batched_tokens = args.max_num_batched_tokens;
  e.max_sequence_length = args.max_sequence_length;
  e.paged = !args.contiguous;
  e.page_size = args.page_size;
  e.kv_cache_bytes = args.kv_cache_mib << 20;
  serve::Metrics metrics;
  // Rank 0: the generator and the HTTP server; its run() returns once the server has stopped.
  auto lead = [&](te::hf::CausalLM model, serve::Broadcast broadcast) {
    metrics.set_gauge("te_serve_weight_bytes", "Bytes of the model's parameters and buffers.",
                      static_cast<double>(te::nn::resident_bytes(*model)));
    serve::Generator generator(model, tokenizer, defaults, options, metrics, std::move(broadcast));
    const te::hf::EngineStats s = generator.stats();
    std::printf(
        "te-serve: loaded %s in %.2f s: %s, %lld layers, weights %.0f MiB%s, context %lld "
        "tokens; KV cache %s: %lld %s%s%s\n",
        args.model_dir.c_str(),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
        model->config.model_type.c_str(), static_cast<long long>(model->config.num_hidden_layers),
        static_cast<double>(te::nn::resident_bytes(*model)) / (1 << 20),
        te::nn::has_block_weights(*model) ? " (GGUF blocks)" : "",
        static_cast<long long>(generator.max_sequence_length()),
        args.contiguous ? "contiguous" : "paged", static_cast<long long>(s.blocks_free),
        args.contiguous ? "slots" : "pages of ",
        args.contiguous ? "" : (std::to_string(args.page_size) + " tokens").c_str(),
        generator.data_parallel_size() == 1
            ? ""
            : (" in each of " + std::to_string(generator.data_parallel_size()) +
               " data-parallel groups (requests spread over them)")
                  .c_str());
    std::printf("te-serve: sampling a request leaves out: %s\n",
                te::hf::describe_sampling(defaults).c_str());
    std::fflush(stdout);
    GenerationHttp http(generator, metrics, args);
    if (!http.start()) {
      generator.stop();
      generator.run();  // tells the other ranks to stop
      return 2;
    }
    try {
      generator.run();
    } catch (const std::exception& e) {
      std::cerr << "te-serve: error: the generation engine failed: " << e.what() << std::endl;
      http.join();  // the streams have ended ("abort"); the server's threads end first
      return 1;
    }
    http.join();
    std::cout << "te-serve: stopped" << std::endl;
    return 0;
  };
  te::hf::LoadOptions load;
  load.dequantize_gguf = args.dequantize_gguf;
  if (args.nproc == 1) return lead(te::hf::load_causal_lm(args.model_dir, load), {});
  std::atomic<int> code{0};
  te::hf::run_on_ranks({args.nproc, args.mesh, args.mesh_resource, args.rules},
                       [&](int rank, const te::DeviceMesh& mesh) {
                         te::hf::CausalLM model = te::hf::load_causal_lm(args.model_dir, load);
                         if (rank == 0) {
                           code = lead(model, broadcast_over(mesh));
                         } else {
                           try {
                             serve::follow(model, options.engine, broadcast_over(mesh));
                           } catch (const std::exception& e) {
                             std::cerr << "te-serve: error: rank " << rank << ": " << e.what()
                                       << std::endl;
                             throw;
                           }
                         }
                       });
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  te::keep_freed_memory();  // steps reuse freed memory (te/runtime/runtime.h)
  // Block the stop signals before any thread starts, so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  Args args;
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
      "  GET /healthz, GET /metrics (Prometheus text)\n"
      "Classify and embeddings requests are batched dynamically; generation requests are decoded\n"
      "together with continuous batching over a paged KV cache. SIGTERM stops taking requests,\n"
      "finishes in-flight ones (generation: within --drain-timeout) and exits 0."};
  app.footer(te::nn::kCpuGemmHelp);
  auto* load = app.add_option("--load", args.load_dir,
                              "Checkpoint directory written by te-encoder --save (any layout), "
                              "or by te-serve --export-fp8: serves POST /v1/classify");
  auto* model = app.add_option("--model", args.model_dir,
                               "A Hugging Face sentence-transformers folder (config.json, "
                               "model.safetensors, tokenizer.json, modules.json, 1_Pooling/; "
                               "e.g. all-MiniLM-L6-v2): serves POST /v1/embeddings. A GGUF file "
                               "or a decoder folder (config.json of a Llama, Mistral, Qwen2/3 "
                               "or GPT-2, model.safetensors, tokenizer.json): serves POST "
                               "/v1/completions and /v1/chat/completions");
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
  const std::string connections = "Connections";
  app.add_option("--http-threads", args.http_threads,
                 "Threads that run request handlers (a classify or embeddings request holds one "
                 "while its batch runs; a generation stream holds none)")
      ->group(connections)
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--max-connections", args.max_connections,
                 "Open connections at most; a connection beyond them is answered 503 and closed "
                 "(default: 4096, or fewer when the open-file limit is lower)")
      ->group(connections)
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  auto deadline = [&](const char* name, double& seconds, const char* help, double most) {
    app.add_option(name, seconds, help)
        ->group(connections)
        ->capture_default_str()
        ->check(CLI::Range(0.01, most));
  };
  deadline("--header-timeout", args.header_timeout_s,
           "Seconds a request's headers may take to arrive (from its connection's opening, or its "
           "first byte on a keep-alive connection); later: 408 and closed",
           3600.0);
  deadline("--body-timeout", args.body_timeout_s,
           "Seconds a request's body may take to arrive after its headers; later: 408", 3600.0);
  deadline("--keep-alive-timeout", args.keep_alive_timeout_s,
           "Seconds an idle keep-alive connection is kept open", 86400.0);
  deadline("--write-timeout", args.write_timeout_s,
           "Seconds a client may leave a response unread before its connection is closed (its "
           "generation request is cancelled)",
           3600.0);
  app.add_option("--drain-timeout", args.drain_timeout_s,
                 "On SIGTERM, seconds in-flight requests and running streams get to finish; "
                 "streams still running then end with finish_reason \"abort\"")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
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
  const std::string decoder = "Decoder models";
  app.add_option("--max-num-seqs", args.max_num_seqs, "Sequences decoded together at most")
      ->group(decoder)
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{4096}));
  app.add_option("--max-num-batched-tokens", args.max_num_batched_tokens,
                 "Tokens in one forward at most: the running sequences' next tokens, then chunks "
                 "of prompts being prefilled (>= --max-num-seqs)")
      ->group(decoder)
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--max-sequence-length", args.max_sequence_length,
                 "The context: prompt and generated tokens of one request at most (0: the "
                 "model's max_position_embeddings)")
      ->group(decoder)
      ->check(CLI::NonNegativeNumber);
  app.add_option("--kv-cache-mib", args.kv_cache_mib,
                 "KV cache memory (per rank); a request that cannot get pages waits (0: enough "
                 "for --max-num-seqs sequences of the whole context)")
      ->group(decoder)
      ->check(CLI::NonNegativeNumber);
  app.add_option("--page-size", args.page_size, "Tokens per KV cache page")
      ->group(decoder)
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{65536}));
  app.add_flag("--contiguous", args.contiguous,
               "A contiguous KV cache (one slot of the whole context per sequence) instead of "
               "pages")
      ->group(decoder);
  app.add_flag("--dequantize-gguf", args.dequantize_gguf,
               "A GGUF file's quantized weights as float32 (5x their memory); by default one "
               "process keeps them in their blocks and decodes them in each GEMM (--nproc > 1 "
               "always dequantizes)")
      ->group(decoder);
  app.add_option("--nproc", args.nproc,
                 "Thread ranks the decoder is sharded over (tensor parallel unless --mesh says "
                 "otherwise): rank 0 serves HTTP and broadcasts each step's batch, every rank "
                 "holds its share of the weights and KV cache")
      ->group(decoder)
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--mesh", args.mesh,
                 "The mesh of the --nproc ranks (default model=N); a data axis (data=2,model=2) "
                 "spreads the requests over data-parallel groups, each decoding its own on its "
                 "model row")
      ->group(decoder);
  app.add_option("--mesh-resource", args.mesh_resource,
                 "TE's MeshResource for the mesh axes (default tp=model, and dp=data when the "
                 "mesh has a data axis)")
      ->group(decoder);
  app.add_option("--rules", args.rules,
                 "Logical axis rules over TE's (default vocab=model: the vocabulary sharded with "
                 "the heads)")
      ->group(decoder);
  CLI11_PARSE(app, argc, argv);

  if (args.load_dir.empty() && args.model_dir.empty()) {
    std::cerr << "te-serve: error: give --load CHECKPOINT (classify) or --model DIR (embeddings)"
              << std::endl;
    return 2;
  }
  try {
    const auto start = std::chrono::steady_clock::now();
    const int64_t resident_before = serve::resident_bytes();
    if (!args.model_dir.empty() && is_decoder(args.model_dir)) {
      if (!args.export_fp8.empty() || !args.eval_tsv.empty() || args.fp8_weights ||
          !args.calibration.empty()) {
        std::cerr << "te-serve: error: --export-fp8, --eval, --fp8-weights and --calibration "
                     "take a te-encoder checkpoint or an embedding model, not a decoder ("
                  << args.model_dir << ")" << std::endl;
        return 2;
      }
      if (args.max_num_batched_tokens < args.max_num_seqs) {
        std::cerr << "te-serve: error: --max-num-batched-tokens " << args.max_num_batched_tokens
                  << " is below --max-num-seqs " << args.max_num_seqs
                  << ": every running sequence's next token must fit in a step" << std::endl;
        return 2;
      }
      if (args.nproc == 1 &&
          (!args.mesh.empty() || !args.mesh_resource.empty() || !args.rules.empty())) {
        std::cerr << "te-serve: error: --mesh, --mesh-resource and --rules need --nproc > 1"
                  << std::endl;
        return 2;
      }
      return serve_generation(args);
    }
    for (const char* option :
         {"--max-num-seqs", "--max-num-batched-tokens", "--max-sequence-length", "--kv-cache-mib",
          "--page-size", "--contiguous", "--dequantize-gguf", "--nproc", "--mesh",
          "--mesh-resource", "--rules"}) {
      if (app.count(option) > 0) {
        std::cerr << "te-serve: error: " << option
                  << " is for a decoder model (--model FILE.gguf or a causal LM folder); "
                  << (args.model_dir.empty() ? "--load" : args.model_dir) << " is not one"
                  << std::endl;
        return 2;
      }
    }
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
