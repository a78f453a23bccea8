#pragma once

// te-serve's parts, each usable and tested on its own: the request decoder, the classifier
// loaded from a te-encoder checkpoint, the dynamic batcher and the Prometheus metrics.

#include <ATen/Tensor.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "data.h"
#include "model.h"
#include "request.h"

namespace serve {

/// What the classifier says about each sentence.
struct Classification {
  std::vector<int64_t> labels;
  std::vector<std::array<float, 2>> probabilities;
  std::vector<bool> truncated;  // longer than max_seq_len: only its first words were read
};

/// The classifier of a te-encoder checkpoint, built from the config and vocabulary the checkpoint
/// holds, on one process, in eval mode. classify() is safe to call from many threads at once.
class Classifier {
 public:
  /// Loads `dir` (a checkpoint te-encoder saved on any layout, or one exported with FP8
  /// weights). With `fp8_weights` the GEMM kernels (te::nn::freeze_fp8_weights) and the
  /// embedding table are held in FP8.
  /// encoder::InputError naming the problem for a missing or damaged checkpoint or one whose
  /// config is not a te-encoder classifier's.
  Classifier(const std::string& dir, bool fp8_weights);

  /// Runs under c10::InferenceMode; the batch is padded to max_seq_len words.
  Classification classify(const std::vector<std::string>& sentences) const;

  int64_t max_seq_len() const { return options_.max_seq_len; }
  bool fp8_weights() const { return fp8_weights_; }
  /// Bytes of the parameters and buffers the model holds (fp32 kernels, or FP8 codes).
  int64_t weight_bytes() const;
  /// Bytes of the checkpoint's data files.
  int64_t checkpoint_bytes() const { return checkpoint_bytes_; }
  const encoder::EncoderClassifier& model() const { return model_; }
  /// Writes the model, with its FP8 weights when it holds them, as a checkpoint te-serve loads.
  void save(const std::string& dir) const;

 private:
  encoder::EncoderOptions options_;
  encoder::Vocabulary vocab_;
  std::string config_json_;
  encoder::EncoderClassifier model_{nullptr};
  bool fp8_weights_ = false;
  int64_t checkpoint_bytes_ = 0;
};

/// Counters and histograms in Prometheus' text format. Thread-safe.
class Metrics {
 public:
  Metrics();
  void request(const std::string& path, int status);
  void latency(double seconds);
  /// One model call: its sentences and its duration.
  void batch(int64_t sentences, double seconds);
  void set_queue_depth(int64_t requests);
  void set_gauge(const std::string& name, const std::string& help, double value);
  std::string render() const;

 private:
  struct Histogram {
    std::vector<double> bounds;
    std::vector<int64_t> counts;  // per bound, plus +Inf
    double sum = 0;
    int64_t count = 0;
    void observe(double v);
  };
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  Histogram latency_, batch_;
  double model_seconds_ = 0;
  int64_t queue_depth_ = 0;
  std::map<std::string, std::pair<std::string, double>> gauges_;
};

struct BatcherOptions {
  int workers = 1;
  int64_t max_batch = 32;      // sentences per model call
  double max_wait_ms = 5;      // how long a batch waits for more requests after its first
  int64_t max_queue = 256;     // requests waiting; more are refused (503)
  int threads_per_worker = 0;  // intra-op threads of each worker (0: cores / workers)
};

/// Dynamic batching: requests from many connections wait in one bounded queue; each worker takes
/// a batch (whole requests, up to max_batch sentences, closed at max_batch or max_wait_ms after
/// its first request), classifies it in one model call and answers each request with its rows. A
/// request of more than max_batch sentences runs alone, in calls of max_batch.
class Batcher {
 public:
  Batcher(const Classifier& classifier, BatcherOptions options, Metrics& metrics);
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  /// Queues `sentences`; the future holds the answer or the error. HttpError 503 when the queue
  /// is full or the batcher is stopping.
  std::future<Classification> submit(std::vector<std::string> sentences);
  /// Batches stop waiting for company: what is queued or gathering runs now (a server that is
  /// draining on SIGTERM should not wait out max_wait_ms). Requests are still taken.
  void drain();
  /// Refuses new requests, answers every queued one, joins the workers.
  void stop();

 private:
  struct Pending {
    std::vector<std::string> sentences;
    std::promise<Classification> answer;
  };
  void work(int index);

  const Classifier& classifier_;
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

/// The body of a successful classify response.
std::string encode_classification(const Classification& c);
/// {"error": message}
std::string error_body(const std::string& message);
/// The resident set size of this process (VmRSS), in bytes; 0 when unknown.
int64_t resident_bytes();

}  // namespace serve
