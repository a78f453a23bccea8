#include "te/serve/server.h"

#include <pthread.h>
#include <signal.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <iostream>

#include "te/error.h"
#include "te/serve/openai.h"

namespace te::serve {

bool ModelNames::serves(const std::string& name) const {
  return std::find(names.begin(), names.end(), name) != names.end();
}

HttpError ModelNames::not_found(const std::string& requested) const {
  std::string all;
  for (const std::string& n : names) all += (all.empty() ? "'" : ", '") + n + "'";
  return HttpError(404, "the model '" + requested + "' does not exist; this server serves " + all,
                   "model", "model_not_found");
}

void ModelNames::check(const std::string& requested) const {
  if (given && !requested.empty() && !serves(requested)) throw not_found(requested);
}

namespace {

using json = nlohmann::json;

json model_object(const ModelNames& models, const std::string& name) {
  return {{"id", name}, {"object", "model"}, {"created", models.created}, {"owned_by", "te-cpp"}};
}

// "%2F" and the like in a path's model name, decoded (a name may hold a '/': "org/model").
std::string percent_decoded(const std::string& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

}  // namespace

std::unique_ptr<http::Server> make_server(const ServerConfig& config, Metrics& metrics,
                                          const std::string& endpoints) {
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
  o.error_body = [](int status, const std::string& message) {
    return openai_error_body(status, message, "");
  };
  o.endpoints = endpoints + ", GET /v1/models";
  system_fingerprint();  // built now, not on the event loop at the first response
  o.metrics = &metrics;
  auto server = std::make_unique<http::Server>(std::move(o));
  for (const char* path : {"/health", "/healthz"}) {  // llama-server's and vLLM's name, and ours
    server->route(
        "GET", path,
        [](const http::Request&, http::Reply reply) {
          http::Response r;
          r.body = "{\"status\":\"ok\"}";
          reply.send(std::move(r));
        },
        http::Server::Run::kInline);  // answered while every worker waits
  }
  const ModelNames models = config.models;
  server->route(
      "GET", "/v1/models",
      [models](const http::Request&, http::Reply reply) {
        json data = json::array();
        for (const std::string& n : models.names) data.push_back(model_object(models, n));
        http::Response r;
        r.body = json{{"object", "list"}, {"data", data}}.dump(-1, ' ', false,
                                                               json::error_handler_t::replace);
        reply.send(std::move(r));
      },
      http::Server::Run::kInline);
  server->route(
      "GET", "/v1/models/*",
      [models](const http::Request& req, http::Reply reply) {
        const std::string name =
            percent_decoded(req.path.substr(std::string("/v1/models/").size()));
        http::Response r;
        if (models.serves(name)) {
          r.body = model_object(models, name).dump(-1, ' ', false, json::error_handler_t::replace);
        } else {
          r.status = 404;
          r.body = openai_error_body(models.not_found(name));
        }
        reply.send(std::move(r));
      },
      http::Server::Run::kInline);
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
