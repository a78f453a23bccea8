#include <chrono>
#include <exception>
#include <functional>
#include <iostream>

#include "te/serve/openai.h"
#include "te/serve/routes.h"

namespace te::serve {

namespace {

// Reads a non-streamed response's pieces as they come and sends the whole body after the last.
std::function<void()> whole_reader(std::shared_ptr<GenerationStream> stream, std::string model,
                                   http::Reply reply) {
  struct Whole {
    std::string text;
    std::vector<TokenInfo> tokens;
  };
  return [stream, model, reply, whole = std::make_shared<Whole>()] {
    Piece piece;
    while (stream->next(piece, std::chrono::milliseconds(0))) {
      whole->text += piece.text;
      whole->tokens.insert(whole->tokens.end(), piece.tokens.begin(), piece.tokens.end());
      if (piece.finish_reason.empty()) continue;
      http::Response res;
      res.body = encode_response(*stream, model, whole->text, whole->tokens, piece.finish_reason);
      reply.send(std::move(res));
      return;
    }
  };
}

// Opens a server-sent-event stream on `reply`; the reader writes each piece's events as they
// come, and ends the stream after the last.
std::function<void()> event_reader(std::shared_ptr<GenerationStream> stream, std::string model,
                                   http::Reply reply) {
  http::Response head;
  head.content_type = "text/event-stream";
  head.headers.emplace_back("Cache-Control", "no-cache");
  reply.open_stream(std::move(head));
  return [stream, model, reply, events = std::make_shared<SseEvents>()] {
    Piece piece;
    while (stream->next(piece, std::chrono::milliseconds(0))) {
      std::string out = events->next(*stream, model, piece);
      if (!out.empty()) reply.write(std::move(out));
      if (!piece.finish_reason.empty()) {
        reply.end();
        return;
      }
    }
  };
}

// OpenAI's error object for a request that failed before its stream began.
http::Response error_response(const HttpError& e) {
  http::Response res;
  res.status = e.status;
  res.body = openai_error_body(e);
  if (e.status == 503) res.headers.emplace_back("Retry-After", "1");
  return res;
}

http::Handler completions(Generator& generator, bool chat, const ModelNames& models) {
  return [&generator, chat, models](const http::Request& req, http::Reply reply) {
    try {
      const CompletionRequest r = decode_completion(req.body, chat);
      models.check(r.model);
      std::shared_ptr<GenerationStream> stream = generator.submit(r);
      const std::string model = models.primary();  // the one that answers
      // A client that goes cancels its request (its pages are freed at the next step) and stops
      // the stream's listening (which holds this reply: the two would hold each other).
      reply.on_gone([stream] {
        stream->cancel();
        stream->unlisten();
      });
      std::function<void()> read =
          r.stream ? event_reader(stream, model, reply) : whole_reader(stream, model, reply);
      stream->listen([reply, read]() mutable { reply.post(read); });
    } catch (const HttpError& e) {
      reply.send(error_response(e));
    } catch (const std::exception& e) {
      reply.send(error_response(HttpError(500, std::string("generation failed: ") + e.what())));
    }
  };
}

}  // namespace

void add_generation_routes(http::Server& server, Generator& generator, const ModelNames& models) {
  server.route("POST", "/v1/completions", completions(generator, false, models));
  server.route("POST", "/v1/chat/completions", completions(generator, true, models));
}

GenerationServer::GenerationServer(Generator& generator, Metrics& metrics,
                                   const ServerConfig& config)
    : generator_(generator),
      config_(config),
      server_(make_server(config, metrics, "POST /v1/completions, POST /v1/chat/completions")) {
  add_generation_routes(*server_, generator, config.models);
}

bool GenerationServer::start(const std::string& limits) {
  const int port = bind_or_report(*server_);
  if (port < 0) return false;
  std::cout << "te-serve: listening on http://" << config_.host << ":" << port
            << " (POST /v1/completions, POST /v1/chat/completions; " << limits << ")" << std::endl;
  std::cout << "te-serve: serving the model as '" << config_.models.primary() << "'"
            << (config_.models.names.size() > 1 ? " (and its other --served-model-name)" : "")
            << std::endl;
  thread_ = std::thread([this] { server_->run(); });
  waiter_ = std::make_unique<SignalWaiter>([this] {
    generator_.drain();
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(config_.drain_timeout_s);
    while (!generator_.idle() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    generator_.stop();
  });
  return true;
}

void GenerationServer::join() {
  server_->shutdown(std::chrono::seconds(2));
  if (thread_.joinable()) thread_.join();
  if (waiter_) waiter_->dismiss();
}

}  // namespace te::serve
