#pragma once

// te-serve's dynamic batcher, for any model call that maps sentences to rows of a Result
// (Classification, Embeddings: service.h): requests from many connections wait in one bounded
// queue; each worker takes a batch (whole requests, up to max_batch sentences, closed at
// max_batch or max_wait_ms after its first request), runs it in one model call and answers each
// request with its rows. A request of more than max_batch sentences runs alone, in calls of
// max_batch. Result provides append(Result&&) and slice(first, last).

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "te/error.h"
#include "te/serve/request.h"
#include "te/serve/service.h"

namespace te::serve {

struct BatcherOptions {
  int workers = 1;
  int64_t max_batch = 32;      // sentences per model call
  double max_wait_ms = 5;      // how long a batch waits for more requests after its first
  int64_t max_queue = 256;     // requests waiting; more are refused (503)
  int threads_per_worker = 0;  // intra-op threads of each worker (0: cores / workers)
};

template <typename Result>
class Batcher {
 public:
  /// The model call: one row of Result per sentence. Called from the workers, concurrently when
  /// there are several.
  using Run = std::function<Result(const std::vector<std::string>&)>;
  Batcher(Run run, BatcherOptions options, Metrics& metrics);
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  /// Queues `sentences`; the future holds the answer or the error. HttpError 503 when the queue
  /// is full or the batcher is stopping.
  std::future<Result> submit(std::vector<std::string> sentences);
  /// Batches stop waiting for company: what is queued or gathering runs now (a server that is
  /// draining on SIGTERM should not wait out max_wait_ms). Requests are still taken.
  void drain();
  /// Refuses new requests, answers every queued one, joins the workers.
  void stop();

 private:
  struct Pending {
    std::vector<std::string> sentences;
    std::promise<Result> answer;
  };
  void work();

  const Run run_;
  const BatcherOptions options_;
  Metrics& metrics_;
  std::mutex mu_;
  std::condition_variable ready_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  bool draining_ = false;
  int64_t waiting_ = 0;  // requests not yet in a model call: queued, or in a gathering batch
  std::vector<std::thread> workers_;
};

template <typename Result>
Batcher<Result>::Batcher(Run run, BatcherOptions options, Metrics& metrics)
    : run_(std::move(run)), options_(options), metrics_(metrics) {
  TE_CHECK(options_.workers >= 1 && options_.max_batch >= 1 && options_.max_queue >= 1 &&
               options_.max_wait_ms >= 0,
           "Batcher: workers, max_batch and max_queue must be at least 1 and max_wait_ms not "
           "negative");
  for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { work(); });
}

template <typename Result>
Batcher<Result>::~Batcher() {
  stop();
}

template <typename Result>
std::future<Result> Batcher<Result>::submit(std::vector<std::string> sentences) {
  Pending p;
  p.sentences = std::move(sentences);
  auto answer = p.answer.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) throw HttpError(503, "the server is shutting down");
    if (static_cast<int64_t>(queue_.size()) >= options_.max_queue) {
      throw HttpError(503, "the queue is full (" + std::to_string(options_.max_queue) +
                               " requests waiting); retry shortly");
    }
    queue_.push_back(std::move(p));
    metrics_.set_queue_depth(++waiting_);
  }
  ready_.notify_one();
  return answer;
}

template <typename Result>
void Batcher<Result>::drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
  }
  ready_.notify_all();
}

template <typename Result>
void Batcher<Result>::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
  workers_.clear();
}

template <typename Result>
void Batcher<Result>::work() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(options_.threads_per_worker > 0
                          ? options_.threads_per_worker
                          : std::max(1, cores / std::max(1, options_.workers)));
  const auto wait = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double, std::milli>(options_.max_wait_ms));
  for (;;) {
    std::vector<Pending> batch;
    int64_t sentences = 0;
    bool more = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything answered
      const auto deadline = std::chrono::steady_clock::now() + wait;
      for (;;) {
        while (!queue_.empty()) {
          const int64_t next = static_cast<int64_t>(queue_.front().sentences.size());
          if (!batch.empty() && sentences + next > options_.max_batch) break;
          sentences += next;
          batch.push_back(std::move(queue_.front()));
          queue_.pop_front();
        }
        const bool full =
            sentences >= options_.max_batch || (!queue_.empty());  // the next request does not fit
        if (full || stopping_ || draining_ || !ready_.wait_until(lock, deadline, [this] {
              return stopping_ || draining_ || !queue_.empty();
            })) {
          break;
        }
      }
      waiting_ -= static_cast<int64_t>(batch.size());
      metrics_.set_queue_depth(waiting_);
      more = !queue_.empty();
    }
    if (more) ready_.notify_one();  // another worker can start the next batch
    std::vector<std::string> all;
    all.reserve(static_cast<std::size_t>(sentences));
    for (const Pending& p : batch) all.insert(all.end(), p.sentences.begin(), p.sentences.end());
    Result result;
    try {
      for (std::size_t start = 0; start < all.size();
           start += static_cast<std::size_t>(options_.max_batch)) {
        const std::size_t end =
            std::min(all.size(), start + static_cast<std::size_t>(options_.max_batch));
        const std::vector<std::string> part(all.begin() + static_cast<std::ptrdiff_t>(start),
                                            all.begin() + static_cast<std::ptrdiff_t>(end));
        const auto began = std::chrono::steady_clock::now();
        Result r = run_(part);
        metrics_.batch(
            static_cast<int64_t>(part.size()),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
        result.append(std::move(r));
      }
    } catch (...) {
      for (Pending& p : batch) p.answer.set_exception(std::current_exception());
      continue;
    }
    std::size_t row = 0;
    for (Pending& p : batch) {
      p.answer.set_value(result.slice(row, row + p.sentences.size()));
      row += p.sentences.size();
    }
  }
}

}  // namespace te::serve
