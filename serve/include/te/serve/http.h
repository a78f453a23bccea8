#pragma once

// te-serve's HTTP/1.1 layer: one event-loop thread (Boost.Asio, Boost.Beast's parser) holds every
// connection, so an idle keep-alive connection or a long stream pins no thread; request handlers
// run on a pool of worker threads and answer through a Reply, whole or as a chunked stream pushed
// from any thread.
//
// Slow and idle clients are shed, each with a deadline of its own (ServerOptions): a request's
// headers must arrive within header_timeout of its connection opening (or, on a keep-alive
// connection, of its first byte), its body within body_timeout (both answered 408 and closed), an
// idle keep-alive connection is closed after keep_alive_timeout, a client that stops reading a
// response is cut after write_timeout, and beyond max_connections a new connection is answered 503
// and closed. A client that goes while its request is being handled is noticed (Reply::on_gone).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "te/serve/metrics.h"

namespace te::serve::http {

struct Request {
  std::string method;  ///< "GET", "POST", ...
  std::string target;  ///< as sent: path and query
  std::string path;    ///< without the query
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  /// The value of header `name` (case-insensitive), "" when absent.
  std::string header(const std::string& name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  ///< more, e.g. Retry-After
};

struct Exchange;

/// A handler's answer to one request, usable from any thread. Either send() once, or
/// open_stream() then write()s and end(). Whatever comes after the first answer (or after the
/// client has gone) is dropped.
class Reply {
 public:
  explicit Reply(std::shared_ptr<Exchange> exchange) : exchange_(std::move(exchange)) {}
  void send(Response response) const;
  /// An error answer: `status` with the server's error body for `message`.
  void fail(int status, std::string message) const;
  /// A chunked response: `head`'s status, content type and headers now (its body, if any, as
  /// the first chunk); write() sends the next chunk, end() the last.
  void open_stream(Response head) const;
  /// False once the client has gone (the chunk is dropped).
  bool write(std::string chunk) const;
  void end() const;
  /// Runs `fn` on the connection's thread, after the writes already asked for: the place to read
  /// a stream's output and write() it, one caller at a time.
  void post(std::function<void()> fn) const;
  /// `fn` runs once if the client goes (disconnects, stops reading, or the server stops) before
  /// the answer is complete: on the connection's thread, or here at once if it has gone already.
  /// (A client that half-closes its end after its request counts as gone.)
  void on_gone(std::function<void()> fn) const;
  bool gone() const;

 private:
  std::shared_ptr<Exchange> exchange_;
};

/// Answers one request; runs on a worker thread (Server::Run). An exception becomes a 500 naming
/// it.
using Handler = std::function<void(const Request&, Reply)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  ///< 0: any free port (Server::bind returns it)
  int worker_threads = 16;
  int64_t max_connections = 4096;
  std::size_t max_body_bytes = std::size_t{1} << 20;
  std::size_t max_header_bytes = 64 * 1024;
  std::chrono::milliseconds header_timeout{10000}, body_timeout{30000}, keep_alive_timeout{30000},
      write_timeout{30000};
  /// The body of an error the server answers itself (404, 408, 413, 431, 500, 503).
  std::function<std::string(int status, const std::string& message)> error_body;
  /// Named in the 404 message: what this server serves.
  std::string endpoints;
  /// Counts requests (by path and status, once answered) and connections; may be null.
  Metrics* metrics = nullptr;
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  /// Where a handler runs: on the worker pool, or on the event loop itself (for handlers that
  /// never block and take microseconds, such as a health check: answered even while every
  /// worker waits).
  enum class Run { kWorker, kInline };
  /// Before bind(): `method` `path` is answered by `handler`: that path exactly, or, for a path
  /// ending in "/*" ("/v1/models/*"), every path below it (the handler reads request.path); an
  /// exact route wins, then the longest such prefix.
  void route(const std::string& method, const std::string& path, Handler handler,
             Run run = Run::kWorker);
  /// Listens on host:port; returns the port. te::Error naming --host/--port when it cannot.
  int bind();
  /// Serves until shutdown() has finished: returns once every connection has closed.
  void run();
  /// From any thread: stops accepting, closes idle connections, lets requests being handled and
  /// streams finish for up to `grace`, then closes what is left.
  void shutdown(std::chrono::milliseconds grace);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace te::serve::http
