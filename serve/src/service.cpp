#include "te/serve/service.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include "te/nn.h"

namespace te::serve {

using json = nlohmann::json;

// ---- requests ----------------------------------------------------------------------------------

std::string encode_classification(const Classification& c) {
  json probabilities = json::array(), truncated = json::array();
  for (const auto& p : c.probabilities) probabilities.push_back({p[0], p[1]});
  for (const bool t : c.truncated) truncated.push_back(t);
  return json{{"labels", c.labels}, {"probabilities", probabilities}, {"truncated", truncated}}
      .dump();
}

void Classification::append(Classification&& more) {
  labels.insert(labels.end(), more.labels.begin(), more.labels.end());
  probabilities.insert(probabilities.end(), more.probabilities.begin(), more.probabilities.end());
  truncated.insert(truncated.end(), more.truncated.begin(), more.truncated.end());
}

Classification Classification::slice(std::size_t first, std::size_t last) const {
  const auto a = static_cast<std::ptrdiff_t>(first), b = static_cast<std::ptrdiff_t>(last);
  Classification c;
  c.labels.assign(labels.begin() + a, labels.begin() + b);
  c.probabilities.assign(probabilities.begin() + a, probabilities.begin() + b);
  c.truncated.assign(truncated.begin() + a, truncated.begin() + b);
  return c;
}

void Embeddings::append(Embeddings&& more) {
  vectors = vectors.defined() ? at::cat({vectors, more.vectors}) : more.vectors;
  tokens.insert(tokens.end(), more.tokens.begin(), more.tokens.end());
  truncated.insert(truncated.end(), more.truncated.begin(), more.truncated.end());
}

Embeddings Embeddings::slice(std::size_t first, std::size_t last) const {
  const auto a = static_cast<std::ptrdiff_t>(first), b = static_cast<std::ptrdiff_t>(last);
  Embeddings e;
  e.vectors = vectors.narrow(0, a, b - a);
  e.tokens.assign(tokens.begin() + a, tokens.begin() + b);
  e.truncated.assign(truncated.begin() + a, truncated.begin() + b);
  return e;
}

// ---- the classifier ----------------------------------------------------------------------------

namespace {

template <typename T>
T config_value(const json& config, const char* key, const std::string& dir) {
  if (!config.contains(key)) {
    throw encoder::InputError("--load " + dir + ": the checkpoint holds no '" + key +
                              "' in its config; give a checkpoint te-encoder --save wrote");
  }
  try {
    return config[key].get<T>();
  } catch (const json::exception&) {
    throw encoder::InputError("--load " + dir + ": the checkpoint's '" + key + "' is " +
                              config[key].dump() + ", not what te-encoder writes");
  }
}

}  // namespace

Classifier::Classifier(const std::string& dir, bool fp8_weights) {
  te::nn::CheckpointInfo info;
  try {
    info = te::nn::read_checkpoint_info(dir);
  } catch (const te::Error& e) {
    throw encoder::InputError("--load " + dir + ": " + e.what());
  }
  checkpoint_bytes_ = info.bytes;
  const json config = json::parse(info.extra_json);
  options_.max_seq_len = config_value<int64_t>(config, "max_seq_len", dir);
  options_.hidden_size = config_value<int64_t>(config, "hidden_size", dir);
  options_.mlp_hidden_size = config_value<int64_t>(config, "mlp_hidden_size", dir);
  options_.num_attention_heads = config_value<int64_t>(config, "heads", dir);
  const auto activations = config_value<std::string>(config, "mlp_activations", dir);
  options_.mlp_activations.clear();
  std::stringstream list(activations);
  for (std::string a; std::getline(list, a, ',');) options_.mlp_activations.push_back(a);
  vocab_.add_words(config_value<std::vector<std::string>>(config, "vocabulary", dir));
  options_.vocab_size = vocab_.size();
  options_.hidden_dropout = options_.attention_dropout = options_.intermediate_dropout = 0;
  config_json_ = info.extra_json;

  const bool saved_fp8 = std::any_of(info.tensors.begin(), info.tensors.end(), [](const auto& n) {
    return n.size() >= 10 && n.compare(n.size() - 10, 10, "fp8_kernel") == 0;
  });
  try {
    model_ = encoder::EncoderClassifier(options_);
    if (saved_fp8) {
      te::nn::prepare_fp8_weights(*model_);
      model_->freeze_fp8_embedding(/*empty=*/true);
    }
    te::nn::CheckpointLoadOptions load;
    load.restore_rng_state = false;
    te::nn::load_checkpoint(*model_, dir, load);
    if (fp8_weights && !saved_fp8) {
      te::nn::freeze_fp8_weights(*model_);
      model_->freeze_fp8_embedding();
    }
  } catch (const te::Error& e) {
    throw encoder::InputError("--load " + dir + ": " + e.what());
  }
  fp8_weights_ = saved_fp8 || fp8_weights;
  model_->eval();
  for (const auto& p : model_->parameters()) p.requires_grad_(false);
}

Classification Classifier::classify(const std::vector<std::string>& sentences) const {
  c10::InferenceMode inference;
  std::vector<encoder::Example> examples;
  examples.reserve(sentences.size());
  for (const auto& s : sentences) examples.push_back({s, 0});
  const encoder::Encoded batch = encoder::encode(examples, vocab_, options_.max_seq_len);
  const at::Tensor mask = encoder::padding_mask(batch.lengths, options_.max_seq_len);
  const at::Tensor logits = model_.ptr()->forward(batch.ids, mask).to(at::kFloat);
  const at::Tensor probs = at::softmax(logits, 1).contiguous();
  const at::Tensor labels = logits.argmax(1);
  Classification out;
  const int64_t n = batch.size();
  const float* p = probs.data_ptr<float>();
  const int64_t* l = labels.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    out.labels.push_back(l[i]);
    out.probabilities.push_back({p[2 * i], p[2 * i + 1]});
  }
  out.truncated = batch.was_truncated;
  return out;
}

int64_t Classifier::weight_bytes() const { return te::nn::resident_bytes(*model_); }

void Classifier::save(const std::string& dir) const {
  try {
    te::nn::save_checkpoint(*model_, dir, config_json_);
  } catch (const te::Error& e) {
    throw encoder::InputError(std::string("saving the FP8 checkpoint: ") + e.what());
  }
}

}  // namespace te::serve
