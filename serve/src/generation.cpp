#include "te/serve/generation.h"

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <random>

#include "te/error.h"
#include "te/gen/wire.h"

namespace te::serve {

using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// Latency buckets (seconds): time to first token and end to end reach seconds under load,
// inter-token latency tens of milliseconds.
const std::vector<double> kLatencyBounds = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                            1,     2.5,  5,     10,   30,  60};
const std::vector<double> kTokenBounds = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06,
                                          0.08,  0.1,    0.15,  0.2,  0.3,  0.5,  1};

// ---- the commands rank 0 broadcasts ------------------------------------------------------

struct Commands {
  Generator::Adds adds;
  std::vector<int64_t> cancels;
  bool stop = false;
};

}  // namespace
}  // namespace te::serve

template <>
struct te::gen::wire::Fields<te::serve::Commands> {
  static auto list() {
    using C = te::serve::Commands;
    return std::make_tuple(field("adds", &C::adds), field("cancels", &C::cancels),
                           field("stop", &C::stop));
  }
};

namespace te::serve {
namespace {

// The same commands on every rank (rank 0's); without a mesh, rank 0's as they are.
Commands share(const Broadcast& broadcast, const Commands& mine) {
  if (!broadcast) return mine;
  return te::gen::wire::from_bytes<Commands>(broadcast(te::gen::wire::to_bytes(mine)),
                                             "te-serve's commands");
}

// One token through the model before serving: a model that cannot run on this mesh fails at
// start, not on its first request, and the first request does not pay for the first forward's
// allocations. Every rank runs it, in the same place.
void warm_up(te::gen::Engine& engine) {
  c10::InferenceMode inference;
  te::gen::GenerateOptions o;
  o.max_tokens = 1;
  o.sampling.temperature = 0;
  engine.add({0}, o);
  while (!engine.idle()) engine.step();
}

// The engine's options with the tokenizer it decodes the text and finds the stop strings with.
te::gen::EngineOptions with_tokenizer(te::gen::EngineOptions options,
                                      const te::hf::Tokenizer& tokenizer) {
  options.tokenizer = std::make_shared<const te::hf::Tokenizer>(tokenizer);
  return options;
}

}  // namespace

// ---- the generator ------------------------------------------------------------------------

Generator::Generator(te::hf::CausalLM model, te::hf::Tokenizer tokenizer,
                     te::hf::GenerationDefaults defaults, GeneratorOptions options,
                     Metrics& metrics, Broadcast broadcast)
    : engine_(model, with_tokenizer(options.engine, tokenizer)),
      tokenizer_(std::move(tokenizer)),
      defaults_(std::move(defaults)),
      options_(std::move(options)),
      metrics_(metrics),
      broadcast_(std::move(broadcast)),
      vocab_size_(model->config.vocab_size) {
  TE_CHECK(options_.max_waiting >= 1, "te-serve: max_waiting is ", options_.max_waiting,
           "; it must be at least 1");
  warm_up(engine_);
  prefill_seen_ = engine_.stats().prefill_tokens;
  if (defaults_.chat_template.empty()) {
    chat_error_ = options_.model_name + " has no chat template; use POST /v1/completions";
  } else {
    try {
      chat_ = std::make_unique<te::gen::ChatTemplate>(
          te::gen::ChatTemplate::recognise(defaults_.chat_template, options_.model_name));
    } catch (const te::Error& e) {
      chat_error_ = std::string(e.what()) + "; use POST /v1/completions";
    }
  }
  update_gauges();
}

std::vector<int64_t> Generator::prompt_ids(const CompletionRequest& r) const {
  std::vector<int64_t> ids;
  if (r.chat) {
    if (!chat_) throw HttpError(400, chat_error_, "messages");
    std::vector<te::gen::ChatMessage> messages;
    for (const Message& m : r.messages) messages.push_back({m.role, m.content});
    te::hf::EncodeOptions encode;
    encode.add_special_tokens = false;  // the template writes its own
    try {
      ids = tokenizer_.encode(chat_->apply(messages), encode).ids;
    } catch (const te::Error& e) {
      throw HttpError(400, e.what(), "messages");
    }
  } else if (!r.prompt_ids.empty()) {
    ids = r.prompt_ids;
  } else {
    try {
      ids = tokenizer_.encode(r.prompt).ids;
    } catch (const te::Error& e) {
      throw HttpError(400, e.what(), "prompt");
    }
  }
  return ids;
}

te::gen::GenerateOptions Generator::generate_options(const CompletionRequest& r,
                                                     const std::vector<int64_t>& ids) const {
  const int64_t context = engine_.max_sequence_length();
  const auto length = static_cast<int64_t>(ids.size());
  te::gen::GenerateOptions o;
  o.max_tokens = r.max_tokens ? *r.max_tokens
                 : r.chat     ? context - length
                              : std::min<int64_t>(16, context - length);
  te::gen::SamplingOptions& s = o.sampling;
  const te::gen::SamplingOptions& d = defaults_.sampling;  // the model's, else llama.cpp's
  s.temperature = r.temperature.value_or(d.temperature);
  s.top_k = r.top_k.value_or(d.top_k);
  s.top_p = r.top_p.value_or(d.top_p);
  s.min_p = r.min_p.value_or(d.min_p);
  s.repetition_penalty = r.repetition_penalty.value_or(d.repetition_penalty);
  s.presence_penalty = r.presence_penalty.value_or(d.presence_penalty);
  s.frequency_penalty = r.frequency_penalty.value_or(d.frequency_penalty);
  s.seed = r.seed ? *r.seed : std::random_device{}() * uint64_t{0x9E3779B97F4A7C15ull};
  o.stop_token_ids = r.stop_token_ids;
  o.top_logprobs = std::max<int64_t>(0, r.logprobs);
  o.stop = r.stop;
  te::gen::RequestLimits limits;
  limits.vocab_size = vocab_size_;
  limits.max_sequence_length = context;
  limits.context = "this server's context";
  limits.max_tokens_within_context = r.max_tokens.has_value();
  limits.max_tokens_field = r.max_tokens_field;
  if (const auto bad = te::gen::request_problem(ids, o, limits)) {
    throw HttpError(400, bad->message,
                    bad->field == "prompt" && r.chat ? std::string("messages") : bad->field,
                    bad->code);
  }
  if (!r.ignore_eos) {  // the model's own, after the check (the request's are checked)
    o.stop_token_ids.insert(o.stop_token_ids.end(), defaults_.eos_token_ids.begin(),
                            defaults_.eos_token_ids.end());
  }
  return o;
}

std::shared_ptr<GenerationStream> Generator::submit(const CompletionRequest& r) {
  std::vector<int64_t> ids = prompt_ids(r);
  const int64_t length = static_cast<int64_t>(ids.size());
  te::gen::GenerateOptions o = generate_options(r, ids);

  std::unique_lock<std::mutex> lock(mu_);
  if (draining_ || stopping_) {
    throw HttpError(503, "the server is shutting down; send the request to another instance");
  }
  if (queued_ >= options_.max_waiting) {
    throw HttpError(503, std::to_string(queued_) +
                             " requests are waiting for the model (--max-queue); try again");
  }
  auto stream = std::shared_ptr<GenerationStream>(new GenerationStream(
      r, tokenizer_, length, (r.chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_stream_++)));
  std::weak_ptr<GenerationStream> weak = stream;
  stream->cancel_ = [this, weak] {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancels_.push_back(weak);
    }
    wake_.notify_all();
  };
  pending_.push_back({std::move(ids), std::move(o), stream, Clock::now()});
  ++queued_;
  lock.unlock();
  wake_.notify_all();
  return stream;
}

void Generator::run() {
  try {
    schedule();
  } catch (...) {
    // Nothing will step again: every stream ends now ("abort"), new requests are refused.
    const te::gen::TokenEvent abort{0, -1, 0, {}, "abort"};
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
      for (Admission& a : pending_) a.stream->deliver({abort});
      pending_.clear();
      active_ = 0;
      busy_ = false;
    }
    for (Admission& a : taken_) a.stream->deliver({abort});  // taken from pending_, not admitted
    taken_.clear();
    for (auto& [id, r] : streams_) r.stream->deliver({abort});
    streams_.clear();
    throw;
  }
}

bool Generator::take_work(std::vector<std::weak_ptr<GenerationStream>>& cancelled) {
  std::unique_lock<std::mutex> lock(mu_);
  // On a mesh the other ranks wait in the broadcast: wake at least once a second so an idle
  // server's collective never times out.
  wake_.wait_for(lock, std::chrono::seconds(1), [&] {
    return stopping_ || !pending_.empty() || !cancels_.empty() || !engine_.idle();
  });
  taken_.assign(std::make_move_iterator(pending_.begin()), std::make_move_iterator(pending_.end()));
  pending_.clear();
  cancelled.swap(cancels_);
  busy_ = true;  // idle() is false until the gauges say where these went
  return stopping_;
}

void Generator::drop_cancelled(const std::vector<std::weak_ptr<GenerationStream>>& cancelled,
                               std::vector<int64_t>& engine_ids) {
  for (const auto& weak : cancelled) {
    const std::shared_ptr<GenerationStream> s = weak.lock();
    if (!s) continue;
    s->cancelled_ = true;
    if (s->engine_id_ >= 0 && streams_.count(s->engine_id_)) {
      engine_ids.push_back(s->engine_id_);
      streams_.erase(s->engine_id_);
      count_finished("cancelled");
    }
  }
}

void Generator::admit(const Adds& adds) {
  for (std::size_t i = 0; i < adds.size(); ++i) {
    Admission& a = taken_[i];
    try {
      const int64_t id = engine_.add(adds[i].first, adds[i].second);
      a.stream->engine_id_ = id;
      streams_[id] = {a.stream, a.submitted, a.submitted, true};
    } catch (const te::Error& e) {  // checked in submit(): not expected
      std::fprintf(stderr, "te-serve: a request the engine refused: %s\n", e.what());
      a.stream->deliver({te::gen::TokenEvent{0, -1, 0, {}, "abort"}});
    }
  }
  taken_.clear();
}

void Generator::step_and_deliver() {
  const std::vector<te::gen::TokenEvent> events = engine_.step();
  const auto now = Clock::now();
  std::map<int64_t, std::vector<te::gen::TokenEvent>> by_request;
  for (const te::gen::TokenEvent& e : events) by_request[e.request].push_back(e);
  int64_t generated = 0;
  for (auto& [id, list] : by_request) {
    generated += static_cast<int64_t>(list.size());
    auto s = streams_.find(id);
    if (s == streams_.end()) continue;  // cancelled
    Running& t = s->second;
    if (t.first) {
      metrics_.observe("te_serve_time_to_first_token_seconds",
                       "From a generation request's arrival to its first token.", kLatencyBounds,
                       seconds(now - t.submitted));
      t.first = false;
    } else {
      metrics_.observe("te_serve_inter_token_latency_seconds",
                       "Between consecutive tokens of a generation request.", kTokenBounds,
                       seconds(now - t.last) / static_cast<double>(list.size()));
    }
    t.last = now;
    const std::string finish = list.back().finish_reason;
    t.stream->deliver(std::move(list));
    if (!finish.empty()) {
      metrics_.observe("te_serve_e2e_request_latency_seconds",
                       "From a generation request's arrival to its last token.", kLatencyBounds,
                       seconds(now - t.submitted));
      count_finished(finish);
      streams_.erase(s);
    }
  }
  metrics_.count("te_serve_generation_tokens_total", "Tokens generated.",
                 static_cast<double>(generated));
}

void Generator::schedule() {
  c10::InferenceMode inference;
  while (true) {
    std::vector<std::weak_ptr<GenerationStream>> cancelled;
    Commands mine;
    mine.stop = take_work(cancelled);
    drop_cancelled(cancelled, mine.cancels);
    std::vector<Admission> admitted;
    for (Admission& a : taken_) {
      if (a.stream->cancelled_) {
        count_finished("cancelled");
        continue;
      }
      if (mine.stop) {
        a.stream->deliver({te::gen::TokenEvent{0, -1, 0, {}, "abort"}});
        continue;
      }
      mine.adds.emplace_back(a.ids, a.options);
      admitted.push_back(std::move(a));
    }
    taken_ = std::move(admitted);  // until the engine has them (the failure path aborts them)
    if (mine.stop) {
      for (auto& [id, r] : streams_) {
        mine.cancels.push_back(id);
        r.stream->deliver({te::gen::TokenEvent{id, -1, 0, {}, "abort"}});
      }
      streams_.clear();
    }
    const Commands all = share(broadcast_, mine);
    for (int64_t id : all.cancels) engine_.cancel(id);
    if (all.stop) break;
    admit(all.adds);
    if (!engine_.idle()) step_and_deliver();
    update_gauges();
  }
  update_gauges();
}

void Generator::update_gauges() {
  const te::gen::EngineStats s = engine_.stats();
  int64_t queued = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued = queued_ = static_cast<int64_t>(pending_.size()) + s.waiting;
    active_ = s.running + s.waiting;
    busy_ = false;
  }
  metrics_.set_gauge("te_serve_running_sequences", "Sequences being decoded or prefilled.",
                     static_cast<double>(s.running));
  metrics_.set_gauge("te_serve_waiting_sequences",
                     "Generation requests waiting for admission (batch, tokens or KV pages).",
                     static_cast<double>(queued));
  metrics_.set_gauge("te_serve_kv_cache_blocks_used",
                     "KV cache pages (contiguous: slots) held by sequences.",
                     static_cast<double>(s.blocks_used));
  metrics_.set_gauge("te_serve_kv_cache_blocks_free", "KV cache pages (contiguous: slots) free.",
                     static_cast<double>(s.blocks_free));
  metrics_.count("te_serve_preemptions_total",
                 "Sequences preempted (their cache freed and recomputed) for want of KV pages.",
                 static_cast<double>(s.preemptions - preemptions_seen_));
  metrics_.count("te_serve_prompt_tokens_total",
                 "Prompt tokens prefilled (recomputation included).",
                 static_cast<double>(s.prefill_tokens - prefill_seen_));
  preemptions_seen_ = s.preemptions;
  prefill_seen_ = s.prefill_tokens;
}

void Generator::count_finished(const std::string& reason) {
  metrics_.count("te_serve_generation_requests_total",
                 "Generation requests ended, by finish reason (cancelled: the client went away).",
                 1, "finish_reason=\"" + reason + "\"");
}

void Generator::drain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

bool Generator::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.empty() && active_ == 0 && !busy_;
}

void Generator::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
}

void follow(te::hf::CausalLM model, const te::hf::Tokenizer& tokenizer,
            const te::gen::EngineOptions& options, const Broadcast& broadcast) {
  c10::InferenceMode inference;
  te::gen::Engine engine(model, with_tokenizer(options, tokenizer));
  warm_up(engine);
  while (true) {
    const Commands c = share(broadcast, Commands{});
    for (int64_t id : c.cancels) engine.cancel(id);
    if (c.stop) return;
    for (const auto& [ids, o] : c.adds) {
      try {
        engine.add(ids, o);
      } catch (const te::Error&) {  // as rank 0's add failed
      }
    }
    if (!engine.idle()) engine.step();
  }
}

}  // namespace te::serve
