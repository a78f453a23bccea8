#include <CLI/CLI.hpp>

#include "args.h"
#include "te/hf/families.h"

namespace te_serve {

const char* const kDecoderOptions[11] = {"--max-num-seqs",
                                         "--max-num-batched-tokens",
                                         "--max-sequence-length",
                                         "--kv-cache-mib",
                                         "--page-size",
                                         "--contiguous",
                                         "--dequantize-gguf",
                                         "--nproc",
                                         "--mesh",
                                         "--mesh-resource",
                                         "--rules"};

namespace {

// --load / --model, where to listen, and the dynamic batching of sentence models.
void add_model_and_batching(CLI::App& app, Args& args) {
  auto* load = app.add_option("--load", args.load_dir,
                              "Checkpoint directory written by te-encoder --save (any layout), "
                              "or by te-serve --export-fp8: serves POST /v1/classify");
  auto* model = app.add_option("--model", args.model_dir,
                               "A Hugging Face sentence-transformers folder (config.json, "
                               "model.safetensors, tokenizer.json, modules.json, 1_Pooling/; "
                               "e.g. all-MiniLM-L6-v2): serves POST /v1/embeddings. A GGUF file "
                               "(" +
                                   te::hf::causal_lm_family_names(/*gguf=*/true) +
                                   ") or a decoder folder (config.json of " +
                                   te::hf::causal_lm_family_titles() +
                                   "; model.safetensors, tokenizer.json): serves POST "
                                   "/v1/completions and /v1/chat/completions");
  load->excludes(model);
  model->excludes(load);
  app.add_option("--served-model-name", args.served_model_names,
                 "The names the model answers to (one or more): responses carry the first, GET "
                 "/v1/models lists them, and a request naming another model is answered 404 "
                 "model_not_found. Default: the --model / --load file or folder name, and any "
                 "requested name is answered")
      ->expected(1, -1);
  app.add_option("--host", args.server.host, "Address to listen on")->capture_default_str();
  app.add_option("--port", args.server.port, "Port (0: any free port, printed at start)")
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
  app.add_option("--max-body-bytes", args.server.max_body_bytes, "Largest request body (more: 413)")
      ->capture_default_str()
      ->check(CLI::Range(std::size_t{64}, std::size_t{1} << 30));
}

// Connections: threads, limits and the deadlines that shed slow and idle clients.
void add_connections(CLI::App& app, Args& args) {
  const std::string connections = "Connections";
  app.add_option("--http-threads", args.server.http_threads,
                 "Threads that run request handlers (a classify or embeddings request holds one "
                 "while its batch runs; a generation stream holds none)")
      ->group(connections)
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--max-connections", args.server.max_connections,
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
  deadline("--header-timeout", args.server.header_timeout_s,
           "Seconds a request's headers may take to arrive (from its connection's opening, or its "
           "first byte on a keep-alive connection); later: 408 and closed",
           3600.0);
  deadline("--body-timeout", args.server.body_timeout_s,
           "Seconds a request's body may take to arrive after its headers; later: 408", 3600.0);
  deadline("--keep-alive-timeout", args.server.keep_alive_timeout_s,
           "Seconds an idle keep-alive connection is kept open", 86400.0);
  deadline("--write-timeout", args.server.write_timeout_s,
           "Seconds a client may leave a response unread before its connection is closed (its "
           "generation request is cancelled)",
           3600.0);
  app.add_option("--drain-timeout", args.server.drain_timeout_s,
                 "On SIGTERM, seconds in-flight requests and running streams get to finish; "
                 "streams still running then end with finish_reason \"abort\"")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
}

// What a classifier or an embedding model takes beyond batching.
void add_sentence_model_options(CLI::App& app, Args& args) {
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
}

// Decoder models: the engine, the KV cache and the mesh.
void add_decoder_options(CLI::App& app, Args& args) {
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
                 "mesh has a data axis); tp=model,ep=model splits a mixture of experts' experts "
                 "over the model axis (expert parallel) and its heads too")
      ->group(decoder);
  app.add_option("--rules", args.rules,
                 "Logical axis rules over TE's (default vocab=model: the vocabulary sharded with "
                 "the heads)")
      ->group(decoder);
}

}  // namespace

void add_options(CLI::App& app, Args& args) {
  add_model_and_batching(app, args);
  add_connections(app, args);
  add_sentence_model_options(app, args);
  add_decoder_options(app, args);
}

}  // namespace te_serve
