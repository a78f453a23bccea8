#pragma once

// The route sets a model kind enables on te-serve's one HTTP server (server.h):
//   - a te-encoder classifier: POST /v1/classify (te's own body, service.h);
//   - a sentence embedding model: POST /v1/embeddings (OpenAI's, openai.h);
//   - a decoder model: POST /v1/completions and POST /v1/chat/completions (OpenAI's), answered
//     by a Generator.
// A classify or embeddings request waits for its dynamic batch (batcher.h) on one of the
// server's workers; a generation stream pins no thread.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "te/hf/sentence.h"
#include "te/serve/batcher.h"
#include "te/serve/generation.h"
#include "te/serve/server.h"

namespace te::serve {

/// POST /v1/classify: at most `max_sentences` sentences a request (more: 413).
void add_classify_routes(http::Server& server, Batcher<Classification>& batcher, Metrics& metrics,
                         std::size_t max_sentences);

/// POST /v1/embeddings of `embedder` (the responses' "model" the first of `models`; a request
/// naming another is refused as ModelNames::check says): at most `max_inputs` texts a request.
void add_embeddings_routes(http::Server& server, Batcher<Embeddings>& batcher, Metrics& metrics,
                           std::size_t max_inputs, const te::hf::SentenceEmbedder& embedder,
                           const ModelNames& models);
/// One model call of the embeddings batcher: `sentences` embedded by `embedder`.
Embeddings embed(const te::hf::SentenceEmbedder& embedder,
                 const std::vector<std::string>& sentences);

/// POST /v1/completions and /v1/chat/completions, answered by `generator`. The worker that takes
/// a request submits it; from then on the generator's scheduler tells the connection when output
/// is waiting (GenerationStream::listen), which reads and writes it on the connection's thread; a
/// client that goes cancels its request.
/// The responses' "model" is the first of `models`; a request naming another is refused as
/// ModelNames::check says.
void add_generation_routes(http::Server& server, Generator& generator, const ModelNames& models);

/// The HTTP side of a generation server, on its own thread, with the drain SIGTERM starts: new
/// requests are refused (503), running streams get `config.drain_timeout_s` to finish and the
/// rest end with finish_reason "abort", then the generator stops (its run() returns).
class GenerationServer {
 public:
  GenerationServer(Generator& generator, Metrics& metrics, const ServerConfig& config);
  /// Binds and serves on a thread, printing where it listens and `limits`; false (printed) when
  /// the port cannot be had.
  bool start(const std::string& limits);
  /// After the generator's run() has returned: the streams write their last events (for up to
  /// 2 s), then the connections close and the server stops.
  void join();

 private:
  Generator& generator_;
  const ServerConfig config_;
  std::unique_ptr<http::Server> server_;
  std::thread thread_;
  std::unique_ptr<SignalWaiter> waiter_;
};

}  // namespace te::serve
