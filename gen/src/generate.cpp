#include "te/gen/generate.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <variant>

#include "te/distributed.h"
#include "te/error.h"
#include "te/gen/text_stream.h"
#include "te/gen/wire.h"
#include "te/nn/sharded.h"

namespace te::gen {

namespace {

// Data parallel: what each group tells the others after a step.
struct GroupStep {
  std::vector<TokenEvent> events;
  EngineStats stats;
};

}  // namespace
}  // namespace te::gen

template <>
struct te::gen::wire::Fields<te::gen::GroupStep> {
  static auto list() {
    using G = te::gen::GroupStep;
    return std::make_tuple(field("events", &G::events), field("stats", &G::stats));
  }
};

namespace te::gen {

// The engine's state and scheduler; Engine's public calls forward here.
struct Engine::Impl {
  Impl(ModelRef model, const EngineOptions& options);
  int64_t add(const std::vector<int64_t>& prompt, const GenerateOptions& options);
  void cancel(int64_t id);
  std::vector<TokenEvent> step();
  EngineStats stats() const;

  struct Sequence {
    int64_t id = 0;
    std::vector<int64_t> tokens;  // prompt, then generated
    int64_t prompt_length = 0;
    int64_t cached = 0;  // tokens in the cache
    int64_t generated = 0;
    GenerateOptions options;
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<TextStream> text;  // with a tokenizer
  };
  TokenEvent sample(Sequence& seq, const at::Tensor& logits);
  /// The event's finish reason and, with a tokenizer, its text (a stop string ends it here).
  void finish_or_go_on(Sequence& seq, TokenEvent& e) const;
  /// This rank's group's counters (the engine's own without data parallelism).
  EngineStats local_stats() const;
  /// step() of this rank's group alone.
  std::vector<TokenEvent> step_group();
  /// A step's sequences and the tokens each runs: the running ones (the latest admitted
  /// preempted until their step fits the cache), then waiting ones admitted first come, first
  /// served while the token budget and the cache allow.
  using Plan = std::vector<std::pair<Sequence*, int64_t>>;
  Plan plan_step();
  /// Data parallel: every group's tokens of this step, from this group's `mine`.
  std::vector<TokenEvent> exchange(std::vector<TokenEvent> mine);
  int64_t live_requests(int64_t group) const;

  /// The data axis when data parallel (the mesh dim "batch" resolves to, of size > 1).
  struct DataParallel {
    DeviceMesh mesh;
    int64_t dim = 0, size = 1, group = 0;
    AxisRules step_rules;  ///< the rules in scope, with "batch" held unsharded
  };
  std::optional<DataParallel> dp_;
  std::map<int64_t, int64_t> remote_;  ///< other groups' live requests: id -> group
  EngineStats remote_stats_;           ///< their counters at the last exchange

  ModelRef model_;
  EngineOptions options_;
  int64_t max_len_ = 0;
  std::unique_ptr<te::nn::InferenceParams> cache_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;  // in admission order
  int64_t next_id_ = 0;
  EngineStats stats_;
};

Engine::Impl::Impl(ModelRef model, const EngineOptions& options)
    : model_(std::move(model)), options_(options) {
  const EngineOptions& o = options_;
  TE_CHECK(!model_->as_module().is_training(),
           "Engine: the model is in training mode; call eval() first");
  TE_CHECK(o.max_num_seqs > 0, "Engine: max_num_seqs ", o.max_num_seqs, " must be > 0");
  TE_CHECK(o.max_num_batched_tokens >= o.max_num_seqs, "Engine: max_num_batched_tokens ",
           o.max_num_batched_tokens, " must be >= max_num_seqs ", o.max_num_seqs,
           " (every running sequence takes a token each step)");
  TE_CHECK(!o.paged || o.page_size > 0, "Engine: page_size ", o.page_size, " must be > 0");
  TE_CHECK(o.kv_cache_bytes >= 0 && o.max_sequence_length >= 0,
           "Engine: kv_cache_bytes and max_sequence_length must be >= 0");
  const int64_t per_token = model_->kv_bytes_per_token(o.kv_cache_dtype);
  const int64_t positions = model_->max_positions();
  max_len_ = o.max_sequence_length ? o.max_sequence_length : positions > 0 ? positions : 2048;
  TE_CHECK(positions == 0 || max_len_ <= positions, "Engine: max_sequence_length ", max_len_,
           " is more than the model's ", positions, " positions");
  int64_t blocks = 0;
  const int64_t block_tokens = o.paged ? o.page_size : max_len_;
  if (o.kv_cache_bytes == 0) {
    blocks = o.max_num_seqs * ((max_len_ + block_tokens - 1) / block_tokens);
  } else {
    blocks = o.kv_cache_bytes / (per_token * block_tokens);
    TE_CHECK(blocks * block_tokens >= max_len_, "Engine: kv_cache_bytes ", o.kv_cache_bytes,
             " holds ", blocks * block_tokens, " tokens of this model (", per_token,
             " bytes each), less than one sequence of max_sequence_length ", max_len_,
             "; give more memory or a shorter max_sequence_length");
  }
  auto cache =
      model_
          ->kv_cache_options(o.paged ? o.max_num_seqs : std::min(o.max_num_seqs, blocks), max_len_)
          .dtype(o.kv_cache_dtype);
  if (o.paged) cache.is_paged(true).page_size(o.page_size).total_num_pages(blocks);
  cache_ = std::make_unique<te::nn::InferenceParams>(cache);
  const DeviceMesh* mesh = current_mesh();
  const std::optional<PartitionSpec> batch =
      mesh ? resolve_logical_axes({axis::kBatch}) : std::nullopt;
  if (batch && !(*batch)[0].empty()) {
    const MeshAxes& axes = (*batch)[0];
    TE_CHECK(axes.size() == 1, "Engine: the rules shard \"batch\" over ", to_string(axes),
             "; data-parallel generation takes one mesh axis");
    const int64_t dim = mesh->axis_index(axes[0]);
    if (mesh->size(dim) > 1) {
      for (const auto& [name, layout] : te::nn::named_parameter_layouts(model_->as_module())) {
        const bool sharded = layout.mesh && *layout.mesh == *mesh &&
                             std::holds_alternative<Shard>(layout.placements.at(dim));
        TE_CHECK(!sharded, "Engine: parameter ", name, " is sharded along mesh axis '", axes[0],
                 "', the data axis (\"batch\" is sharded there); data-parallel generation needs "
                 "the weights replicated along it (drop the fsdp role or rule for that axis)");
      }
      AxisRules rules = *rules_in_effect();
      rules.insert(rules.begin(), AxisRule{axis::kBatch, {}});
      dp_ = DataParallel{*mesh, dim, mesh->size(dim), mesh->coordinate(dim), std::move(rules)};
    }
  }
}

int64_t Engine::Impl::add(const std::vector<int64_t>& prompt, const GenerateOptions& options) {
  RequestLimits limits;
  limits.vocab_size = model_->vocab_size();
  limits.max_sequence_length = max_len_;
  check_request(prompt, options, limits, "Engine::add");
  TE_CHECK(options.stop.empty() || options_.tokenizer,
           "Engine::add: the request has stop strings but the Engine has no tokenizer to find them "
           "with (set EngineOptions::tokenizer)");
  const int64_t id = next_id_++;
  if (dp_) {  // the group with the fewest requests takes it (every rank decides alike)
    int64_t group = 0;
    for (int64_t g = 1; g < dp_->size; ++g) {
      if (live_requests(g) < live_requests(group)) group = g;
    }
    if (group != dp_->group) {
      remote_[id] = group;
      return id;
    }
  }
  auto seq = std::make_unique<Sequence>();
  seq->id = id;
  seq->tokens = prompt;
  seq->prompt_length = static_cast<int64_t>(prompt.size());
  seq->options = options;
  seq->sampler = std::make_unique<Sampler>(options.sampling);
  if (options_.tokenizer) {
    seq->text = std::make_unique<TextStream>(options_.tokenizer, options.stop);
  }
  waiting_.push_back(std::move(seq));
  return waiting_.back()->id;
}

int64_t Engine::Impl::live_requests(int64_t group) const {
  if (dp_ && group == dp_->group) return static_cast<int64_t>(waiting_.size() + running_.size());
  return std::count_if(remote_.begin(), remote_.end(),
                       [group](const auto& r) { return r.second == group; });
}

void Engine::Impl::cancel(int64_t id) {
  if (remote_.erase(id) > 0) return;  // its group cancels it
  auto match = [id](const std::unique_ptr<Sequence>& s) { return s->id == id; };
  waiting_.erase(std::remove_if(waiting_.begin(), waiting_.end(), match), waiting_.end());
  running_.erase(std::remove_if(running_.begin(), running_.end(), match), running_.end());
  cache_->end(id);
}

EngineStats Engine::Impl::local_stats() const {
  EngineStats s = stats_;
  s.running = static_cast<int64_t>(running_.size());
  s.waiting = static_cast<int64_t>(waiting_.size());
  s.blocks_free = cache_->free_blocks();
  s.blocks_used = cache_->total_blocks() - s.blocks_free;
  return s;
}

EngineStats Engine::Impl::stats() const {
  EngineStats s = local_stats();
  if (dp_) {  // the other groups' as of the last step; requests added since wait there
    const EngineStats& r = remote_stats_;
    const int64_t running = std::min<int64_t>(r.running, static_cast<int64_t>(remote_.size()));
    s.running += running;
    s.waiting += static_cast<int64_t>(remote_.size()) - running;
    s.blocks_used += r.blocks_used;
    s.blocks_free += r.blocks_free;
    s.preemptions += r.preemptions;
    s.prefill_tokens += r.prefill_tokens;
    s.decode_tokens += r.decode_tokens;
  }
  return s;
}

TokenEvent Engine::Impl::sample(Sequence& seq, const at::Tensor& logits) {
  TokenEvent e;
  e.request = seq.id;
  e.token = seq.sampler->next(logits, seq.tokens, static_cast<std::size_t>(seq.prompt_length));
  // log_softmax at the tokens asked for: logit - logsumexp.
  const at::Tensor l = logits.to(at::kFloat);
  const float lse = at::logsumexp(l, 0).item<float>();
  e.logprob = l[e.token].item<float>() - lse;
  if (seq.options.top_logprobs > 0) {
    const auto [values, ids] = at::topk(l, seq.options.top_logprobs);
    for (int64_t i = 0; i < values.size(0); ++i) {
      e.top_logprobs.emplace_back(ids[i].item<int64_t>(), values[i].item<float>() - lse);
    }
  }
  seq.tokens.push_back(e.token);
  ++seq.generated;
  finish_or_go_on(seq, e);
  return e;
}

void Engine::Impl::finish_or_go_on(Sequence& seq, TokenEvent& e) const {
  const auto& stop = seq.options.stop_token_ids;
  if (std::find(stop.begin(), stop.end(), e.token) != stop.end()) {
    e.finish_reason = "stop";  // the stop token's own text is not returned
    if (seq.text) e.text = seq.text->finish();
    return;
  }
  if (seq.text) {
    e.text = seq.text->push(e.token);
    if (seq.text->stopped()) {  // a stop string: the text before it is out, the request ends
      e.finish_reason = "stop";
      return;
    }
  }
  if (seq.generated >= seq.options.max_tokens ||
      static_cast<int64_t>(seq.tokens.size()) >= max_len_) {
    e.finish_reason = "length";
    if (seq.text) e.text += seq.text->finish();
  }
}

std::vector<TokenEvent> Engine::Impl::step() {
  if (!dp_) return step_group();
  std::vector<TokenEvent> mine;
  {
    AxisRulesScope group_rules(dp_->step_rules);  // the group's tokens stay whole on its row
    mine = step_group();
  }
  return exchange(std::move(mine));
}

std::vector<TokenEvent> Engine::Impl::exchange(std::vector<TokenEvent> mine) {
  c10::InferenceMode inference;
  GroupStep step{std::move(mine), local_stats()};
  // One group's message per coordinate of the data-parallel dim (te::gen::wire's bytes).
  const std::vector<std::string> all = dp_->mesh.all_gather(wire::to_bytes(step), {dp_->dim});
  std::vector<TokenEvent> events;
  remote_stats_ = EngineStats{};
  for (int64_t g = 0; g < dp_->size; ++g) {
    if (g == dp_->group) {
      events.insert(events.end(), step.events.begin(), step.events.end());
      continue;
    }
    GroupStep theirs = wire::from_bytes<GroupStep>(all[static_cast<std::size_t>(g)],
                                                   "group " + std::to_string(g) + "'s step");
    const EngineStats& s = theirs.stats;
    remote_stats_.running += s.running;
    remote_stats_.blocks_used += s.blocks_used;
    remote_stats_.blocks_free += s.blocks_free;
    remote_stats_.preemptions += s.preemptions;
    remote_stats_.prefill_tokens += s.prefill_tokens;
    remote_stats_.decode_tokens += s.decode_tokens;
    for (TokenEvent& e : theirs.events) {
      if (!e.finish_reason.empty()) remote_.erase(e.request);
      events.push_back(std::move(e));
    }
  }
  return events;
}

Engine::Impl::Plan Engine::Impl::plan_step() {
  const EngineOptions& o = options_;
  // What the cache holds now: the last step's sequences (every other has been freed).
  auto blocks_held = [&](int64_t id) {
    const int64_t len = cache_->seqlen(id);
    return len == 0 ? 0 : cache_->blocks_for(len);
  };
  Plan plan;  // sequence, tokens this step
  int64_t budget = 0, blocks_needed = 0;
  auto blocks_free = [&]() {
    int64_t freed = 0;
    for (int64_t id : cache_->sequence_ids()) {
      const bool planned =
          std::any_of(plan.begin(), plan.end(), [id](const auto& p) { return p.first->id == id; });
      if (!planned) freed += blocks_held(id);
    }
    return cache_->free_blocks() + freed;
  };
  bool preempted = false;
  for (;;) {  // the running sequences, preempting the latest admitted until their step fits
    plan.clear();
    budget = o.max_num_batched_tokens;
    blocks_needed = 0;
    for (auto& seq : running_) {
      plan.emplace_back(seq.get(), 1);
      --budget;
    }
    for (auto& [seq, n] : plan) {  // prompts being prefilled take what budget is left
      const int64_t extra =
          std::min<int64_t>(static_cast<int64_t>(seq->tokens.size()) - seq->cached - 1, budget);
      n += extra;
      budget -= extra;
    }
    for (const auto& [seq, n] : plan) {
      blocks_needed += cache_->blocks_for(seq->cached + n) - blocks_held(seq->id);
    }
    if (running_.size() <= 1 || blocks_needed <= blocks_free()) break;
    std::unique_ptr<Sequence> last = std::move(running_.back());
    running_.pop_back();
    last->cached = 0;
    cache_->end(last->id);
    waiting_.push_front(std::move(last));
    ++stats_.preemptions;
    preempted = true;
  }
  // Admit waiting requests (first come, first served) while the budget and the cache allow.
  while (!preempted && !waiting_.empty() && budget > 0 &&
         static_cast<int64_t>(running_.size()) < o.max_num_seqs &&
         static_cast<int64_t>(plan.size()) < cache_->options().max_batch_size()) {
    Sequence& seq = *waiting_.front();
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(seq.tokens.size()), budget);
    const int64_t need = cache_->blocks_for(n);
    if (blocks_needed + need > blocks_free()) break;
    blocks_needed += need;
    budget -= n;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    plan.emplace_back(running_.back().get(), n);
  }
  return plan;
}

std::vector<TokenEvent> Engine::Impl::step_group() {
  c10::InferenceMode inference;
  const Plan plan = plan_step();
  if (plan.empty()) {  // nothing to run: free what the cache still holds
    cache_->reset();
    return {};
  }
  std::vector<std::pair<int64_t, int64_t>> step;
  std::vector<int64_t> ids;
  for (const auto& [seq, n] : plan) {
    step.emplace_back(seq->id, n);
    ids.insert(ids.end(), seq->tokens.begin() + seq->cached, seq->tokens.begin() + seq->cached + n);
  }
  cache_->pre_step(step);
  const at::Tensor input = at::tensor(ids, at::kLong);
  const at::Tensor logits = current_mesh() ? model_->step_on_mesh(input, *cache_).full_tensor()
                                           : model_->step(input, *cache_);
  ++stats_.steps;
  std::vector<TokenEvent> events;
  std::set<int64_t> finished;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    Sequence& seq = *plan[i].first;
    const int64_t n = plan[i].second;
    (n == 1 && seq.cached + 1 == static_cast<int64_t>(seq.tokens.size()) && seq.generated > 0
         ? stats_.decode_tokens
         : stats_.prefill_tokens) += n;
    seq.cached += n;
    if (seq.cached < static_cast<int64_t>(seq.tokens.size())) continue;  // still prefilling
    events.push_back(sample(seq, logits[static_cast<int64_t>(i)]));
    if (!events.back().finish_reason.empty()) finished.insert(seq.id);
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [&](const auto& s) { return finished.count(s->id) > 0; }),
                 running_.end());
  for (int64_t id : finished) cache_->end(id);
  return events;
}

Engine::Engine(ModelRef model, const EngineOptions& options)
    : impl_(std::make_unique<Impl>(std::move(model), options)) {}
Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

int64_t Engine::add(const std::vector<int64_t>& prompt, const GenerateOptions& options) {
  return impl_->add(prompt, options);
}
void Engine::cancel(int64_t id) { impl_->cancel(id); }
std::vector<TokenEvent> Engine::step() { return impl_->step(); }
bool Engine::idle() const {
  return impl_->waiting_.empty() && impl_->running_.empty() && impl_->remote_.empty();
}
EngineStats Engine::stats() const { return impl_->stats(); }
const te::nn::InferenceParams& Engine::cache() const { return *impl_->cache_; }
int64_t Engine::max_sequence_length() const { return impl_->max_len_; }
int64_t Engine::data_parallel_size() const { return impl_->dp_ ? impl_->dp_->size : 1; }

}  // namespace te::gen
