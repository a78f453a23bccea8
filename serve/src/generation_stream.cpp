#include <ctime>

#include "te/serve/generation.h"

namespace te::serve {

GenerationStream::GenerationStream(CompletionRequest request, te::hf::Tokenizer tokenizer,
                                   int64_t prompt_tokens, std::string id)
    : request_(std::move(request)),
      tokenizer_(std::move(tokenizer)),
      prompt_tokens_(prompt_tokens),
      id_(std::move(id)),
      created_(static_cast<int64_t>(std::time(nullptr))) {}

void GenerationStream::deliver(std::vector<te::gen::TokenEvent> events) {
  std::shared_ptr<const std::function<void()>> listener;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& e : events) events_.push_back(std::move(e));
    listener = listener_;
  }
  ready_.notify_all();
  if (listener) (*listener)();
}

void GenerationStream::listen(std::function<void()> fn) {
  bool waiting = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_ || deaf_) return;
    listener_ = std::make_shared<const std::function<void()>>(fn);
    waiting = !events_.empty();
  }
  if (waiting) fn();
}

void GenerationStream::unlisten() {
  std::shared_ptr<const std::function<void()>> listener;  // released outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  deaf_ = true;
  listener.swap(listener_);
}

void GenerationStream::cancel() {
  if (cancel_) cancel_();
}

bool GenerationStream::next(Piece& out, std::chrono::milliseconds timeout) {
  std::deque<te::gen::TokenEvent> events;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (done_) return false;
    if (!ready_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return false;
    events.swap(events_);
  }
  out = Piece{};
  for (const te::gen::TokenEvent& e : events) {
    if (e.token >= 0) {
      ++completion_tokens_;
      if (request_.logprobs >= 0) {
        TokenInfo t;
        t.text = tokenizer_.decode({e.token}, false);
        t.bytes = t.text;
        t.offset = token_bytes_;
        token_bytes_ += static_cast<int64_t>(t.text.size());
        t.logprob = e.logprob;
        for (const auto& [id, lp] : e.top_logprobs) {
          t.top.emplace_back(tokenizer_.decode({id}, false), lp);
        }
        out.tokens.push_back(std::move(t));
      }
    }
    // The engine's text: final, without a stop token's text or a stop string.
    out.text += e.text;
    if (!e.finish_reason.empty()) {
      out.finish_reason = e.finish_reason;
      break;
    }
  }
  if (!out.finish_reason.empty()) {
    std::shared_ptr<const std::function<void()>> listener;  // released outside the lock
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    listener.swap(listener_);
  }
  return true;
}

}  // namespace te::serve
