#include "service.h"

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

namespace serve {

using json = nlohmann::json;

// ---- requests ----------------------------------------------------------------------------------

std::string encode_classification(const Classification& c) {
  json probabilities = json::array(), truncated = json::array();
  for (const auto& p : c.probabilities) probabilities.push_back({p[0], p[1]});
  for (const bool t : c.truncated) truncated.push_back(t);
  return json{{"labels", c.labels}, {"probabilities", probabilities}, {"truncated", truncated}}
      .dump();
}

std::string error_body(const std::string& message) { return json{{"error", message}}.dump(); }

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

int64_t Classifier::weight_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : model_->parameters()) bytes += p.numel() * p.element_size();
  for (const auto& b : model_->buffers()) bytes += b.numel() * b.element_size();
  return bytes;
}

void Classifier::save(const std::string& dir) const {
  try {
    te::nn::save_checkpoint(*model_, dir, config_json_);
  } catch (const te::Error& e) {
    throw encoder::InputError(std::string("saving the FP8 checkpoint: ") + e.what());
  }
}

// ---- metrics -----------------------------------------------------------------------------------

void Metrics::Histogram::observe(double v) {
  std::size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  ++counts[i];
  sum += v;
  ++count;
}

Metrics::Metrics() {
  latency_.bounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  latency_.counts.assign(latency_.bounds.size() + 1, 0);
  batch_.bounds = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  batch_.counts.assign(batch_.bounds.size() + 1, 0);
}

void Metrics::request(const std::string& path, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{path, status}];
}

void Metrics::latency(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  latency_.observe(seconds);
}

void Metrics::batch(int64_t sentences, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  batch_.observe(static_cast<double>(sentences));
  model_seconds_ += seconds;
}

void Metrics::set_queue_depth(int64_t requests) {
  std::lock_guard<std::mutex> lock(mu_);
  queue_depth_ = requests;
}

void Metrics::set_gauge(const std::string& name, const std::string& help, double value) {
  std::lock_guard<std::mutex> lock(mu_);
  gauges_[name] = {help, value};
}

namespace {

std::string number(double v) {
  std::ostringstream s;
  s.precision(10);
  s << v;
  return s.str();
}

void render_histogram(std::ostringstream& out, const std::string& name, const std::string& help,
                      const std::vector<double>& bounds, const std::vector<int64_t>& counts,
                      double sum, int64_t count) {
  out << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
  int64_t cumulative = 0;
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    cumulative += counts[i];
    out << name << "_bucket{le=\"" << number(bounds[i]) << "\"} " << cumulative << "\n";
  }
  out << name << "_bucket{le=\"+Inf\"} " << count << "\n"
      << name << "_sum " << number(sum) << "\n"
      << name << "_count " << count << "\n";
}

}  // namespace

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream out;
  out << "# HELP te_serve_requests_total HTTP requests answered, by path and status.\n"
         "# TYPE te_serve_requests_total counter\n";
  for (const auto& [key, n] : requests_) {
    out << "te_serve_requests_total{path=\"" << key.first << "\",status=\"" << key.second << "\"} "
        << n << "\n";
  }
  render_histogram(out, "te_serve_request_duration_seconds",
                   "Time from receiving a classify request to its answer.", latency_.bounds,
                   latency_.counts, latency_.sum, latency_.count);
  render_histogram(out, "te_serve_batch_size", "Sentences per model call.", batch_.bounds,
                   batch_.counts, batch_.sum, batch_.count);
  out << "# HELP te_serve_model_seconds_total Time the workers spent in model calls.\n"
         "# TYPE te_serve_model_seconds_total counter\n"
         "te_serve_model_seconds_total "
      << number(model_seconds_) << "\n";
  out << "# HELP te_serve_queue_depth Requests waiting for a model call (queued, or in a batch "
         "still gathering).\n"
         "# TYPE te_serve_queue_depth gauge\n"
         "te_serve_queue_depth "
      << queue_depth_ << "\n";
  for (const auto& [name, g] : gauges_) {
    out << "# HELP " << name << " " << g.first << "\n# TYPE " << name << " gauge\n"
        << name << " " << number(g.second) << "\n";
  }
  return out.str();
}

// ---- batching ----------------------------------------------------------------------------------

Batcher::Batcher(const Classifier& classifier, BatcherOptions options, Metrics& metrics)
    : classifier_(classifier), options_(options), metrics_(metrics) {
  TE_CHECK(options_.workers >= 1 && options_.max_batch >= 1 && options_.max_queue >= 1 &&
               options_.max_wait_ms >= 0,
           "Batcher: workers, max_batch and max_queue must be at least 1 and max_wait_ms not "
           "negative");
  for (int i = 0; i < options_.workers; ++i) workers_.emplace_back([this, i] { work(i); });
}

Batcher::~Batcher() { stop(); }

std::future<Classification> Batcher::submit(std::vector<std::string> sentences) {
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

void Batcher::drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    draining_ = true;
  }
  ready_.notify_all();
}

void Batcher::stop() {
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

void Batcher::work(int /*index*/) {
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
    Classification result;
    try {
      for (std::size_t start = 0; start < all.size();
           start += static_cast<std::size_t>(options_.max_batch)) {
        const std::size_t end =
            std::min(all.size(), start + static_cast<std::size_t>(options_.max_batch));
        const std::vector<std::string> part(all.begin() + static_cast<std::ptrdiff_t>(start),
                                            all.begin() + static_cast<std::ptrdiff_t>(end));
        const auto began = std::chrono::steady_clock::now();
        Classification c = classifier_.classify(part);
        metrics_.batch(
            static_cast<int64_t>(part.size()),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
        result.labels.insert(result.labels.end(), c.labels.begin(), c.labels.end());
        result.probabilities.insert(result.probabilities.end(), c.probabilities.begin(),
                                    c.probabilities.end());
        result.truncated.insert(result.truncated.end(), c.truncated.begin(), c.truncated.end());
      }
    } catch (...) {
      for (Pending& p : batch) p.answer.set_exception(std::current_exception());
      continue;
    }
    std::size_t row = 0;
    for (Pending& p : batch) {
      Classification mine;
      const auto first = static_cast<std::ptrdiff_t>(row);
      const auto last = static_cast<std::ptrdiff_t>(row + p.sentences.size());
      mine.labels.assign(result.labels.begin() + first, result.labels.begin() + last);
      mine.probabilities.assign(result.probabilities.begin() + first,
                                result.probabilities.begin() + last);
      mine.truncated.assign(result.truncated.begin() + first, result.truncated.begin() + last);
      row += p.sentences.size();
      p.answer.set_value(std::move(mine));
    }
  }
}

int64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream in(line.substr(6));
      int64_t kib = 0;
      in >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

}  // namespace serve
