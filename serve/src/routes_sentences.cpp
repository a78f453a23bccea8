#include <chrono>
#include <exception>
#include <functional>

#include "te/serve/openai.h"
#include "te/serve/routes.h"

namespace te::serve {

namespace {

// A request's answer, or its error as JSON with its status (503 with Retry-After); its time goes
// into the latency histogram.
http::Response answer(Metrics& metrics, const char* what,
                      const std::function<std::string()>& body_of) {
  const auto start = std::chrono::steady_clock::now();
  http::Response r;
  try {
    r.body = body_of();
  } catch (const HttpError& e) {
    r.status = e.status;
    r.body = openai_error_body(e);
    if (e.status == 503) r.headers.emplace_back("Retry-After", "1");
  } catch (const std::exception& e) {
    r.status = 500;
    r.body = openai_error_body(500, std::string(what) + " failed: " + e.what(), "");
  }
  metrics.latency(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return r;
}

}  // namespace

void add_classify_routes(http::Server& server, Batcher<Classification>& batcher, Metrics& metrics,
                         std::size_t max_sentences) {
  server.route("POST", "/v1/classify",
               [&, max_sentences](const http::Request& req, http::Reply reply) {
                 reply.send(answer(metrics, "classification", [&] {
                   auto a = batcher.submit(decode_classify(req.body, max_sentences));
                   return encode_classification(a.get());
                 }));
               });
}

Embeddings embed(const te::hf::SentenceEmbedder& embedder,
                 const std::vector<std::string>& sentences) {
  te::hf::SentenceEmbedder::Info info;
  Embeddings e;
  e.vectors = embedder.embed(sentences, 0, &info);
  e.tokens = std::move(info.tokens);
  e.truncated = std::move(info.truncated);
  return e;
}

void add_embeddings_routes(http::Server& server, Batcher<Embeddings>& batcher, Metrics& metrics,
                           std::size_t max_inputs, const te::hf::SentenceEmbedder& embedder,
                           const ModelNames& models) {
  server.route("POST", "/v1/embeddings",
               [&, max_inputs, models](const http::Request& req, http::Reply reply) {
                 reply.send(answer(metrics, "embedding", [&] {
                   EmbeddingsRequest r =
                       decode_embeddings(req.body, max_inputs, embedder.dimensions());
                   models.check(r.model);
                   auto a = batcher.submit(std::move(r.input));
                   return encode_embeddings(a.get(), r.base64, models.primary());
                 }));
               });
}

}  // namespace te::serve
