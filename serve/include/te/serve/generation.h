#pragma once

// te-serve's generation service for a decoder model: the Generator turns checked completion
// requests (request.h) into token ids, queues them, and drives one te::gen::Engine (continuous
// batching over a paged KV cache, the text and stop strings found as tokens come) from one
// scheduler thread; each request's GenerationStream hands the engine's text to the connection
// that answers it, piece by piece, as it comes (listen). The
// HTTP layer (http.h, routes.h) only moves bytes: the response bodies and server-sent events are
// openai.h's.
//
// On a mesh the scheduler runs on rank 0 and broadcasts each iteration's commands (requests
// admitted, requests cancelled, stop) to the other ranks, which run follow(): every rank makes the
// same Engine calls in the same order and holds its slice of the KV cache.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "te/gen/chat_template.h"
#include "te/gen/generate.h"
#include "te/hf/causal_lm.h"
#include "te/hf/chat.h"
#include "te/hf/tokenizer.h"
#include "te/serve/openai.h"
#include "te/serve/service.h"

namespace te::serve {

/// Rank 0's commands to the other ranks (te::gen::wire's bytes, DeviceMesh::broadcast carries
/// them): rank 0's bytes in, the same bytes on every rank out.
using Broadcast = std::function<std::string(const std::string& bytes)>;

struct GeneratorOptions {
  /// The engine's options (its tokenizer is the Generator's).
  te::gen::EngineOptions engine;
  /// Requests waiting for admission at most; more are answered 503 with Retry-After.
  int64_t max_waiting = 256;
  /// The "model" of the responses (the file or folder name).
  std::string model_name;
};

/// One token of a response, with its log-probabilities when the request asked for them.
struct TokenInfo {
  std::string text;  ///< the token alone, decoded (may be part of a character)
  std::string bytes;
  int64_t offset = 0;  ///< bytes of the tokens before it in this response
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;  ///< (token text, logprob), most likely first
};

/// What a request's stream yields: text that is now final, the tokens behind it, and on the last
/// piece the finish reason ("stop": a stop token or string, "length": max_tokens or the context,
/// "abort": the server stopped before the end).
struct Piece {
  std::string text;
  std::vector<TokenInfo> tokens;
  std::string finish_reason;  ///< "" until the last piece
};

/// One request's output, read by the thread that answers it.
class GenerationStream {
 public:
  /// Waits at most `timeout` for the next piece: false when none came (the request goes on).
  /// After the last piece (finish_reason set) it returns false at once.
  bool next(Piece& out, std::chrono::milliseconds timeout);
  /// The client has gone: the request ends at the scheduler's next iteration and its pages are
  /// freed.
  void cancel();
  /// `fn` is called (from the scheduler's thread, or here when output is already waiting) each
  /// time new output arrives; it should only hand the reading to another thread (next() with a
  /// zero timeout), as the HTTP layer does. Dropped after the last piece is read.
  void listen(std::function<void()> fn);
  /// Drops the listener; a later listen() is ignored (the reader has gone).
  void unlisten();
  int64_t prompt_tokens() const { return prompt_tokens_; }
  /// Tokens generated and read so far.
  int64_t completion_tokens() const { return completion_tokens_; }
  const CompletionRequest& request() const { return request_; }
  /// "cmpl-N" / "chatcmpl-N" and the Unix time it was created at (the response's id, created).
  const std::string& id() const { return id_; }
  int64_t created() const { return created_; }

 private:
  friend class Generator;
  GenerationStream(CompletionRequest request, te::hf::Tokenizer tokenizer, int64_t prompt_tokens,
                   std::string id);
  void deliver(std::vector<te::gen::TokenEvent> events);  // scheduler side

  const CompletionRequest request_;
  const te::hf::Tokenizer tokenizer_;  // the log-probabilities' token texts
  const int64_t prompt_tokens_;
  const std::string id_;
  const int64_t created_;
  int64_t completion_tokens_ = 0;
  int64_t token_bytes_ = 0;  // bytes of the tokens read so far (TokenInfo::offset)
  bool done_ = false;        // the last piece has been read
  std::function<void()> cancel_;
  // Set by the scheduler (engine_id_) and by cancel (cancelled_).
  std::atomic<int64_t> engine_id_{-1};
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<te::gen::TokenEvent> events_;
  // Shared, so a delivery takes it without copying the function (and calls it outside the lock).
  std::shared_ptr<const std::function<void()>> listener_;
  bool deaf_ = false;  // unlisten() was called
};

class Generator {
 public:
  /// `model` (eval mode) with its tokenizer and generation defaults (end-of-sequence tokens, chat
  /// template). On a mesh, construct it on rank 0 under the mesh's scopes, with `broadcast`.
  Generator(te::hf::CausalLM model, te::hf::Tokenizer tokenizer,
            te::hf::GenerationDefaults defaults, GeneratorOptions options, Metrics& metrics,
            Broadcast broadcast = {});
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  /// Checks and queues a request (from any thread). HttpError 400 naming the problem for a prompt
  /// that leaves no room to generate in the context, max_tokens beyond it, a token id outside the
  /// vocabulary, a chat request to a model without a template te-cpp knows; 503 when the
  /// waiting queue is full or the server is draining.
  std::shared_ptr<GenerationStream> submit(const CompletionRequest& request);

  /// The scheduler: admits, steps and delivers until stop(). Run it on the thread that holds the
  /// model's scopes (rank 0's, on a mesh); it runs under c10::InferenceMode. When a step throws,
  /// every stream ends with finish_reason "abort", new requests get 503, and the error leaves.
  void run();
  /// New requests are answered 503; running and waiting ones go on.
  void drain();
  /// Nothing running or waiting.
  bool idle() const;
  /// Ends what still runs (finish_reason "abort") and makes run() return (and, on a mesh, the
  /// other ranks' follow()).
  void stop();

  const std::string& model_name() const { return options_.model_name; }
  /// The engine's counters (from the scheduler's thread, or before run()).
  te::gen::EngineStats stats() const { return engine_.stats(); }
  int64_t max_sequence_length() const { return engine_.max_sequence_length(); }
  int64_t data_parallel_size() const { return engine_.data_parallel_size(); }
  const te::hf::Tokenizer& tokenizer() const { return tokenizer_; }

  /// Requests to add to the engine: prompt ids and options (rank 0's, broadcast on a mesh).
  using Adds = std::vector<std::pair<std::vector<int64_t>, te::gen::GenerateOptions>>;

 private:
  struct Admission {
    std::vector<int64_t> ids;
    te::gen::GenerateOptions options;
    std::shared_ptr<GenerationStream> stream;
    std::chrono::steady_clock::time_point submitted;
  };
  // A request in the engine: its stream and when its last token came.
  struct Running {
    std::shared_ptr<GenerationStream> stream;
    std::chrono::steady_clock::time_point submitted, last;
    bool first = true;
  };
  void schedule();  // run()'s loop, one iteration after the other:
  /// Waits (at most a second) for work; moves the new requests into taken_ and the cancelled
  /// ones into `cancelled`; true when stop() was called.
  bool take_work(std::vector<std::weak_ptr<GenerationStream>>& cancelled);
  /// Forgets the cancelled streams the engine runs, whose ids go into `engine_ids`.
  void drop_cancelled(const std::vector<std::weak_ptr<GenerationStream>>& cancelled,
                      std::vector<int64_t>& engine_ids);
  /// Adds taken_'s requests (whose prompts and options are `adds`) to the engine.
  void admit(const Adds& adds);
  /// One engine step; its tokens go to their streams, with the latency metrics.
  void step_and_deliver();
  /// The prompt's token ids (the chat template applied); HttpError 400 for a prompt that cannot be
  /// read.
  std::vector<int64_t> prompt_ids(const CompletionRequest& r) const;
  /// How the engine generates for `r` after the prompt `ids`: its length within the context, its
  /// sampling (the model's defaults for what it leaves out), its stop tokens and strings;
  /// HttpError 400 naming the field te::gen::request_problem finds at fault (the engine's own
  /// check, made before the request is queued).
  te::gen::GenerateOptions generate_options(const CompletionRequest& r,
                                            const std::vector<int64_t>& ids) const;
  void update_gauges();
  void count_finished(const std::string& reason);

  te::gen::Engine engine_;
  const te::hf::Tokenizer tokenizer_;
  const te::hf::GenerationDefaults defaults_;
  const GeneratorOptions options_;
  Metrics& metrics_;
  const Broadcast broadcast_;
  const int64_t vocab_size_;
  std::unique_ptr<te::gen::ChatTemplate> chat_;  // null: the model has none te-cpp knows
  std::string chat_error_;

  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Admission> pending_;
  std::vector<std::weak_ptr<GenerationStream>> cancels_;
  int64_t queued_ = 0;  // pending plus the engine's waiting, as last seen
  int64_t active_ = 0;  // admitted and not finished
  int64_t next_stream_ = 0;
  bool draining_ = false, stopping_ = false;
  bool busy_ = false;  // the scheduler holds requests taken from pending_ in this iteration
  // Scheduler-only state.
  std::vector<Admission> taken_;        // taken from pending_, not yet in the engine
  std::map<int64_t, Running> streams_;  // by engine id
  int64_t preemptions_seen_ = 0, prefill_seen_ = 0;
};

/// The other ranks' side of a Generator on a mesh: makes the Engine calls rank 0's broadcast
/// commands say, until rank 0 stops. `tokenizer` is rank 0's (every rank's engine finds the
/// stop strings alike).
void follow(te::hf::CausalLM model, const te::hf::Tokenizer& tokenizer,
            const te::gen::EngineOptions& options, const Broadcast& broadcast);

}  // namespace te::serve
