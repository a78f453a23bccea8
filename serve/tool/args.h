#pragma once

// te-serve's command line: what main.cpp's programs run with, and the parser (options.cpp).

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "te/serve/server.h"

namespace te_serve {

struct Args {
  std::string load_dir;
  std::string model_dir;
  te::serve::ServerConfig server;
  // Sentence models (--load, --model with modules.json).
  int workers = 1;
  int64_t max_batch = 32;
  double max_wait_ms = 5;
  int64_t max_queue = 256;
  int64_t max_request_sentences = 0;  // 0: 8 x max_batch
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
  int nproc = 1;
  std::string mesh, mesh_resource, rules;
  std::vector<std::string> served_model_names;
};

/// The options of every mode on `app`, bound to `args`.
void add_options(CLI::App& app, Args& args);
/// The options only a decoder model takes (named when given for another kind).
extern const char* const kDecoderOptions[11];

}  // namespace te_serve
