#include "programs.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include "te/distributed.h"
#include "te/hf/ranks.h"
#include "te/nn/inference.h"
#include "te/serve/routes.h"

namespace te_serve {

namespace serve = te::serve;

int serve_sentences(const Args& args, const serve::Classifier* classifier,
                    const te::hf::SentenceEmbedder* embedder) {
  serve::Metrics metrics;
  metrics.set_gauge("te_serve_weight_bytes", "Bytes of the model's parameters and buffers.",
                    static_cast<double>(classifier ? classifier->weight_bytes()
                                                   : te::nn::resident_bytes(*embedder->encoder())));
  if (classifier) {
    metrics.set_gauge("te_serve_checkpoint_bytes", "Bytes of the loaded checkpoint's data files.",
                      static_cast<double>(classifier->checkpoint_bytes()));
  }
  serve::BatcherOptions options;
  options.workers = args.workers;
  options.max_batch = args.max_batch;
  options.max_wait_ms = args.max_wait_ms;
  options.max_queue = args.max_queue;
  options.threads_per_worker = args.threads_per_worker;
  const std::size_t max_sentences = static_cast<std::size_t>(
      args.max_request_sentences > 0 ? args.max_request_sentences : 8 * args.max_batch);
  // One batcher, for the one model this server holds.
  std::optional<serve::Batcher<serve::Classification>> classify;
  std::optional<serve::Batcher<serve::Embeddings>> embeddings;
  auto server = serve::make_server(args.server, metrics,
                                   classifier ? "POST /v1/classify" : "POST /v1/embeddings");
  if (classifier) {
    classify.emplace(
        [classifier](const std::vector<std::string>& s) { return classifier->classify(s); },
        options, metrics);
    serve::add_classify_routes(*server, *classify, metrics, max_sentences);
  } else {
    embeddings.emplace(
        [embedder](const std::vector<std::string>& s) { return serve::embed(*embedder, s); },
        options, metrics);
    serve::add_embeddings_routes(*server, *embeddings, metrics, max_sentences, *embedder,
                                 args.server.models);
  }
  const int port = serve::bind_or_report(*server);
  if (port < 0) return 2;
  // SIGTERM/SIGINT: stop accepting, answer what is in flight (within --drain-timeout), exit 0.
  serve::SignalWaiter waiter([&] {
    classify ? classify->drain() : embeddings->drain();  // gathering batches run now
    server->shutdown(
        std::chrono::milliseconds(static_cast<int64_t>(args.server.drain_timeout_s * 1000)));
  });
  std::cout << "te-serve: listening on http://" << args.server.host << ":" << port << " ("
            << args.workers << " worker" << (args.workers == 1 ? "" : "s") << ", max batch "
            << args.max_batch << ", max wait " << args.max_wait_ms << " ms, queue "
            << args.max_queue << ")" << std::endl;
  server->run();
  // The connections have closed; the batcher answers anything still queued.
  classify ? classify->stop() : embeddings->stop();
  waiter.dismiss();
  server.reset();  // the workers finish
  std::cout << "te-serve: stopped" << std::endl;
  return 0;
}

namespace {

// What te-serve prints once the decoder is loaded: the model, its context and the KV cache.
void print_loaded(const Args& args, const te::hf::CausalLM& model,
                  const serve::Generator& generator, double seconds) {
  const te::gen::EngineStats s = generator.stats();
  const std::string groups = generator.data_parallel_size() == 1
                                 ? ""
                                 : " in each of " + std::to_string(generator.data_parallel_size()) +
                                       " data-parallel groups (requests spread over them)";
  std::printf(
      "te-serve: loaded %s in %.2f s: %s, %lld layers, weights %.0f MiB%s, context %lld "
      "tokens; KV cache %s: %lld %s%s%s\n",
      args.model_dir.c_str(), seconds, model->config.model_type.c_str(),
      static_cast<long long>(model->config.num_hidden_layers),
      static_cast<double>(te::nn::resident_bytes(*model)) / (1 << 20),
      te::nn::has_block_weights(*model) ? " (GGUF blocks)" : "",
      static_cast<long long>(generator.max_sequence_length()),
      args.contiguous ? "contiguous" : "paged", static_cast<long long>(s.blocks_free),
      args.contiguous ? "slots" : "pages of ",
      args.contiguous ? "" : (std::to_string(args.page_size) + " tokens").c_str(), groups.c_str());
}

// Rank 0's commands to the other ranks over `mesh`.
serve::Broadcast broadcast_over(const te::DeviceMesh& mesh) {
  return [&mesh](const std::string& bytes) { return mesh.broadcast(bytes, 0); };
}

// Rank 0 (or the one process): the generator and the HTTP server; returns once the server has
// stopped.
int lead(const Args& args, te::hf::CausalLM model, const te::hf::Tokenizer& tokenizer,
         const te::hf::GenerationDefaults& defaults, const serve::GeneratorOptions& options,
         serve::Broadcast broadcast, std::chrono::steady_clock::time_point start) {
  serve::Metrics metrics;
  metrics.set_gauge("te_serve_weight_bytes", "Bytes of the model's parameters and buffers.",
                    static_cast<double>(te::nn::resident_bytes(*model)));
  serve::Generator generator(model, tokenizer, defaults, options, metrics, std::move(broadcast));
  print_loaded(args, model, generator,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  std::printf("te-serve: sampling a request leaves out: %s\n",
              te::hf::describe_sampling(defaults).c_str());
  std::fflush(stdout);
  serve::GenerationServer http(generator, metrics, args.server);
  if (!http.start("max " + std::to_string(args.max_num_seqs) + " sequences, " +
                  std::to_string(args.max_num_batched_tokens) + " tokens per step, queue " +
                  std::to_string(args.max_queue))) {
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
}

}  // namespace

int serve_generation(const Args& args) {
  const auto start = std::chrono::steady_clock::now();
  const bool gguf = std::filesystem::is_regular_file(args.model_dir);
  const te::hf::Tokenizer tokenizer = gguf ? te::hf::Tokenizer::from_file(args.model_dir)
                                           : te::hf::Tokenizer::from_pretrained(args.model_dir);
  const te::hf::GenerationDefaults defaults = te::hf::read_generation_defaults(args.model_dir);
  serve::GeneratorOptions options;
  options.model_name = args.server.models.primary();
  options.max_waiting = args.max_queue;
  te::gen::EngineOptions& e = options.engine;
  e.max_num_seqs = args.max_num_seqs;
  e.max_num_batched_tokens = args.max_num_batched_tokens;
  e.max_sequence_length = args.max_sequence_length;
  e.paged = !args.contiguous;
  e.page_size = args.page_size;
  e.kv_cache_bytes = args.kv_cache_mib << 20;
  te::hf::LoadOptions load;
  load.dequantize_gguf = args.dequantize_gguf;
  if (args.nproc == 1) {
    return lead(args, te::hf::load_causal_lm(args.model_dir, load), tokenizer, defaults, options,
                {}, start);
  }
  std::atomic<int> code{0};
  te::hf::run_on_ranks(
      {args.nproc, args.mesh, args.mesh_resource, args.rules},
      [&](int rank, const te::DeviceMesh& mesh) {
        te::hf::CausalLM model = te::hf::load_causal_lm(args.model_dir, load);
        if (rank == 0) {
          code = lead(args, model, tokenizer, defaults, options, broadcast_over(mesh), start);
          return;
        }
        try {
          serve::follow(model, tokenizer, options.engine, broadcast_over(mesh));
        } catch (const std::exception& e) {
          std::cerr << "te-serve: error: rank " << rank << ": " << e.what() << std::endl;
          throw;
        }
      });
  return code;
}

}  // namespace te_serve
