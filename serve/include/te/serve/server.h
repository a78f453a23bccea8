#pragma once

// What every kind of te-serve server shares: the HTTP server with its connections and deadlines
// from the command line, GET /health (and /healthz), GET /metrics and GET /v1/models, binding with
// the reason printed when the port cannot be had, and the wait for SIGTERM/SIGINT that starts a
// drain. The route sets that a model kind enables are routes.h's.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "te/serve/http.h"
#include "te/serve/metrics.h"
#include "te/serve/request.h"

namespace te::serve {

/// The names the served model answers to (--served-model-name, vLLM's option: one or more
/// aliases; else the model's file or folder name). Responses carry the first; GET /v1/models lists
/// them all. With names given, a request whose "model" is none of them is answered 404
/// model_not_found, as OpenAI and vLLM answer; without, any name is answered, as llama-server
/// does.
struct ModelNames {
  std::vector<std::string> names;  ///< at least one
  bool given = false;              ///< from --served-model-name
  int64_t created = 0;             ///< when the server started (Unix seconds)
  const std::string& primary() const { return names.front(); }
  bool serves(const std::string& name) const;
  /// HttpError 404 model_not_found (param "model") naming `requested` and the names.
  HttpError not_found(const std::string& requested) const;
  /// Throws not_found when names were given and `requested` is not empty and none of them.
  void check(const std::string& requested) const;
};

/// Where the server listens, its connection limits and its deadlines (te-serve's "Connections"
/// options), and the model's names.
struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;  ///< 0: any free port
  int http_threads = 128;
  int64_t max_connections = 0;  ///< 0: as many as the open-file limit allows, at most 4096
  std::size_t max_body_bytes = std::size_t{1} << 20;
  double header_timeout_s = 10, body_timeout_s = 30, keep_alive_timeout_s = 30,
         write_timeout_s = 30;
  /// On SIGTERM, seconds in-flight requests and running streams get to finish.
  double drain_timeout_s = 30;
  ModelNames models;
};

/// An HTTP server with `config`'s connections and deadlines, answering GET /health and GET
/// /healthz (on the event loop, while every worker waits), GET /metrics (`metrics`, with the
/// resident memory), GET /v1/models and GET /v1/models/{name} (OpenAI's model objects of
/// config.models, owned_by "te-cpp"; 404 model_not_found for another name); every error the server
/// answers itself is OpenAI's error object, and a 404 names `endpoints`.
std::unique_ptr<http::Server> make_server(const ServerConfig& config, Metrics& metrics,
                                          const std::string& endpoints);

/// Listens on --host/--port: the port, or -1 once "te-serve: error: ..." says why it cannot.
int bind_or_report(http::Server& server);

/// Waits for SIGTERM/SIGINT on its own thread and then calls `on_signal`; dismiss() ends the wait
/// without it. The signals must be blocked in every thread first (block_stop_signals), so nothing
/// runs in a signal handler.
class SignalWaiter {
 public:
  explicit SignalWaiter(std::function<void()> on_signal);
  ~SignalWaiter() { dismiss(); }
  SignalWaiter(const SignalWaiter&) = delete;
  SignalWaiter& operator=(const SignalWaiter&) = delete;
  void dismiss();

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

/// Blocks SIGTERM and SIGINT in the calling thread, and so in every thread it starts after: call
/// it first thing in main.
void block_stop_signals();

}  // namespace te::serve
