#include "te/serve/server.h"

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <iostream>

#include "te/error.h"

namespace te::serve {

std::unique_ptr<http::Server> make_server(
    const ServerConfig& config, Metrics& metrics, const std::string& endpoints,
    std::function<std::string(int status, const std::string& message)> error_of) {
  auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000.0)); };
  http::ServerOptions o;
  o.host = config.host;
  o.port = config.port;
  o.worker_threads = config.http_threads;
  o.max_connections = config.max_connections;
  o.max_body_bytes = config.max_body_bytes;
  o.header_timeout = ms(config.header_timeout_s);
  o.body_timeout = ms(config.body_timeout_s);
  o.keep_alive_timeout = ms(config.keep_alive_timeout_s);
  o.write_timeout = ms(config.write_timeout_s);
  o.error_body = std::move(error_of);
  o.endpoints = endpoints;
  o.metrics = &metrics;
  auto server = std::make_unique<http::Server>(std::move(o));
  server->route(
      "GET", "/healthz",
      [](const http::Request&, http::Reply reply) {
        http::Response r;
        r.body = "{\"status\":\"ok\"}";
        reply.send(std::move(r));
      },
      http::Server::Run::kInline);  // answered while every worker waits
  server->route(
      "GET", "/metrics",
      [&metrics](const http::Request&, http::Reply reply) {
        metrics.set_gauge("te_serve_resident_bytes", "Resident memory of the process (VmRSS).",
                          static_cast<double>(resident_bytes()));
        http::Response r;
        r.content_type = "text/plain; version=0.0.4";
        r.body = metrics.render();
        reply.send(std::move(r));
      },
      http::Server::Run::kInline);
  return server;
}

int bind_or_report(http::Server& server) {
  try {
    return server.bind();
  } catch (const te::Error& e) {
    std::cerr << "te-serve: error: " << e.what() << std::endl;
    return -1;
  }
}

namespace {

sigset_t stop_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  return signals;
}

}  // namespace

void block_stop_signals() {
  const sigset_t signals = stop_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
}

SignalWaiter::SignalWaiter(std::function<void()> on_signal)
    : thread_([this, on_signal = std::move(on_signal)] {
        const sigset_t signals = stop_signals();
        int sig = 0;
        while (sigwait(&signals, &sig) == 0) {
          if (done_.load() || sig == SIGTERM || sig == SIGINT) break;
        }
        if (done_.load()) return;
        std::cout << "te-serve: " << (sig == SIGINT ? "SIGINT" : "SIGTERM")
                  << ": draining in-flight requests" << std::endl;
        on_signal();
      }) {}

void SignalWaiter::dismiss() {
  if (!thread_.joinable()) return;
  done_.store(true);
  pthread_kill(thread_.native_handle(), SIGTERM);
  thread_.join();
}

}  // namespace te::serve
