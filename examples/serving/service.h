#pragma once

// te-serve's parts, each usable and tested on its own: the request decoder (request.h), the
// classifier loaded from a te-encoder checkpoint, the results the dynamic batcher (batcher.h)
// hands back, and the Prometheus metrics.

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
  // The row operations the Batcher needs (batcher.h).
  void append(Classification&& more);
  Classification slice(std::size_t first, std::size_t last) const;
};

/// Each sentence's embedding (a row of `vectors`, float32), its token count and whether it was
/// cut at the model's max length.
struct Embeddings {
  at::Tensor vectors;
  std::vector<int64_t> tokens;
  std::vector<bool> truncated;
  void append(Embeddings&& more);
  Embeddings slice(std::size_t first, std::size_t last) const;
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
  /// Observes `value` in the histogram `name` (made with `help` and `bounds` on first use).
  void observe(const std::string& name, const std::string& help, const std::vector<double>& bounds,
               double value);
  /// Adds `delta` to the counter `name`{`labels`} (labels: "" or e.g. `reason="stop"`).
  void count(const std::string& name, const std::string& help, double delta,
             const std::string& labels = "");
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
  std::map<std::string, std::pair<std::string, Histogram>> histograms_;
  std::map<std::string, std::pair<std::string, std::map<std::string, double>>> counters_;
};

/// The body of a successful classify response.
std::string encode_classification(const Classification& c);
/// The body of a successful OpenAI embeddings response: {"object": "list", "data": [{"object":
/// "embedding", "index": i, "embedding": [floats] or base64 of little-endian float32}], "model",
/// "usage": {"prompt_tokens", "total_tokens"}}, and te's "truncated" list.
std::string encode_embeddings(const Embeddings& e, bool base64, const std::string& model);
/// {"error": message}
std::string error_body(const std::string& message);
/// The resident set size of this process (VmRSS), in bytes; 0 when unknown.
int64_t resident_bytes();

}  // namespace serve
