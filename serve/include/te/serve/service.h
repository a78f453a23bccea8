#pragma once

// te-serve's sentence models: the classifier loaded from a te-encoder checkpoint, and the results
// the dynamic batcher (batcher.h) hands back for it and for a sentence embedding model; the body
// of te's own classify route.

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

#include "te/encoder/data.h"
#include "te/encoder/model.h"
#include "te/serve/metrics.h"
#include "te/serve/request.h"

namespace te::serve {

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

/// The body of a successful classify response.
std::string encode_classification(const Classification& c);

}  // namespace te::serve
