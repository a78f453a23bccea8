#pragma once

// Text generation with a LanguageModel (model.h; te::hf::CausalLM is one): how the next token is
// chosen (Sampler, with transformers' logits processors), and the Engine that decodes many
// requests together over one KV cache with iteration-level scheduling (continuous batching): at
// every step waiting requests join, finished ones leave, and long prompts are prefilled in chunks
// beside the decoding ones. With a tokenizer the Engine also turns each request's tokens into
// text and ends it at its stop strings, in the step that completes one. generate() runs a set of
// requests to the end on an Engine; te-serve drives one request by request.
//
// Example:
//   te::hf::CausalLM model = te::hf::load_causal_lm("SmolLM2-135M-Instruct.gguf");
//   te::gen::GenerateOptions o;
//   o.max_tokens = 64;
//   o.sampling.temperature = 0;  // greedy
//   std::vector<int64_t> out = te::gen::generate(model, {prompt_ids}, o)[0].tokens;

#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "te/distributed/mesh.h"
#include "te/gen/detokenizer.h"
#include "te/gen/model.h"
#include "te/gen/request.h"
#include "te/gen/sampling.h"
#include "te/nn/kv_cache.h"

namespace te::gen {

/// One request's token chooser.
class Sampler {
 public:
  explicit Sampler(const SamplingOptions& options);
  /// The probabilities it draws from for `logits` [vocab] after `context` (the prompt and the
  /// tokens generated so far: context[generated_from:] are the generated ones, which presence
  /// and frequency penalties count): float32 [vocab]. Greedy: one-hot.
  at::Tensor distribution(const at::Tensor& logits, const std::vector<int64_t>& context,
                          std::size_t generated_from = 0) const;
  /// The next token: a draw from distribution() by the request's random stream (one uniform
  /// number per token, inverse CDF over the ids in order), or greedy's argmax.
  int64_t next(const at::Tensor& logits, const std::vector<int64_t>& context,
               std::size_t generated_from = 0);
  const SamplingOptions& options() const { return options_; }

 private:
  SamplingOptions options_;
  std::mt19937_64 random_;
};

/// One generated token of one request.
struct TokenEvent {
  int64_t request = 0;
  int64_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int64_t, float>> top_logprobs;
  /// "" while the request goes on; "stop" (a stop token, this one, or a stop string this token
  /// completed) or "length" (max_tokens, or the context is full) on its last token.
  std::string finish_reason;
  /// With the Engine's tokenizer: the text this token made final (TextStream's push). A character
  /// whose bytes are not all there, or an end that could begin a stop string, waits for later
  /// tokens; the last event carries what was held back. Neither a stop token's text nor a stop
  /// string is in it. "" without a tokenizer.
  std::string text;
};

/// What generate() returns for one request.
struct Generated {
  std::vector<int64_t> tokens;  ///< the stop token included when drawn
  std::vector<float> logprobs;
  std::vector<std::vector<std::pair<int64_t, float>>> top_logprobs;
  std::string finish_reason;
  std::string text;  ///< the events' text, with the Engine's tokenizer
};

struct EngineOptions {
  /// Sequences decoded together at most.
  int64_t max_num_seqs = 32;
  /// Tokens in one forward at most: every running sequence's next token, then chunks of the
  /// prompts being prefilled (a longer prompt takes several steps). >= max_num_seqs.
  int64_t max_num_batched_tokens = 512;
  /// A sequence's tokens at most (prompt and generated); 0: the model's max_position_embeddings.
  int64_t max_sequence_length = 0;
  /// A paged cache (pages of page_size tokens from a shared pool) or contiguous (one slot of
  /// max_sequence_length tokens per sequence).
  bool paged = true;
  int64_t page_size = 16;
  /// The cache's memory on each rank; 0: enough for max_num_seqs sequences of
  /// max_sequence_length. A request that cannot get pages waits for them.
  int64_t kv_cache_bytes = 0;
  /// The cache's dtype.
  at::ScalarType kv_cache_dtype = at::kFloat;
  /// Decodes each request's tokens into TokenEvent::text and finds its stop strings (needed by a
  /// request with GenerateOptions::stop); on a mesh every rank's Engine needs the same one.
  std::shared_ptr<const Detokenizer> tokenizer;
};

/// Counters of an Engine (te-serve's /metrics).
struct EngineStats {
  int64_t running = 0, waiting = 0;
  int64_t blocks_used = 0, blocks_free = 0;  ///< pages (or slots, contiguous)
  int64_t preemptions = 0;
  int64_t steps = 0, prefill_tokens = 0, decode_tokens = 0;
};

/// Continuous batching over one KV cache. Not thread-safe: one thread adds, cancels and steps
/// (te-serve's scheduler). On a mesh every rank runs the same Engine calls in the same order
/// (each holds its cache slice):
///   - tensor parallel: every rank decodes every request with its shard of the heads;
///   - data parallel (the rules in scope at construction shard "batch" over a mesh axis of D > 1
///     ranks, e.g. DP2 x TP2): each request goes to one of the D groups (the one with the fewest
///     requests; ties to the lowest), which prefills, decodes and samples it on its own
///     tensor-parallel row with its own cache, "batch" held unsharded inside the group; after
///     each step the groups exchange their tokens over the data axis, so step() returns every
///     request's tokens on every rank. The weights must be replicated along that axis (te::Error
///     naming a parameter FSDP shards there).
class Engine {
 public:
  explicit Engine(ModelRef model, const EngineOptions& options = {});
  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;

  /// Queues a request; returns its id. te::Error (nothing queued) for what check_request
  /// refuses (request.h: an empty prompt, one that leaves no room to generate within
  /// max_sequence_length, a token id outside the vocabulary, bad options, naming the field), or
  /// stop strings without a tokenizer.
  int64_t add(const std::vector<int64_t>& prompt, const GenerateOptions& options);
  /// Ends request `id` now (waiting or running) and frees its pages. Unknown
  /// or finished ids are ignored.
  void cancel(int64_t id);
  /// One iteration: admits waiting requests the token budget and the cache allow, runs one
  /// forward over the running sequences' next tokens and prompt chunks, and returns the tokens
  /// it generated (a sequence still prefilling has none yet). When the cache cannot hold every
  /// running sequence's next token, the latest admitted is preempted: its cache freed, it
  /// waits again and is recomputed from its prompt and tokens so far.
  std::vector<TokenEvent> step();
  /// No request waiting or running.
  bool idle() const;
  EngineStats stats() const;
  const te::nn::InferenceParams& cache() const;
  int64_t max_sequence_length() const;
  /// The data-parallel groups requests are spread over (1: none).
  int64_t data_parallel_size() const;

 private:
  struct Impl;  // the sequences, the cache, the scheduler and the data-parallel exchange
  std::unique_ptr<Impl> impl_;
};

/// Runs `prompts` to the end together on an Engine of `engine` options; `on_token` (optional)
/// sees every token as it is generated, by prompt index.
std::vector<Generated> generate(ModelRef model, const std::vector<std::vector<int64_t>>& prompts,
                                const GenerateOptions& options, const EngineOptions& engine = {},
                                const std::function<void(const TokenEvent&)>& on_token = {});

}  // namespace te::gen
