#include "te/serve/metrics.h"

#include <fstream>
#include <sstream>

namespace te::serve {

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

void Metrics::observe(const std::string& name, const std::string& help,
                      const std::vector<double>& bounds, double value) {
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, added] = histograms_.try_emplace(name);
  if (added) {
    it->second.first = help;
    it->second.second.bounds = bounds;
    it->second.second.counts.assign(bounds.size() + 1, 0);
  }
  it->second.second.observe(value);
}

void Metrics::count(const std::string& name, const std::string& help, double delta,
                    const std::string& labels) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& c = counters_[name];
  c.first = help;
  c.second[labels] += delta;
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
  for (const auto& [name, h] : histograms_) {
    render_histogram(out, name, h.first, h.second.bounds, h.second.counts, h.second.sum,
                     h.second.count);
  }
  for (const auto& [name, c] : counters_) {
    out << "# HELP " << name << " " << c.first << "\n# TYPE " << name << " counter\n";
    for (const auto& [labels, v] : c.second) {
      out << name << (labels.empty() ? "" : "{" + labels + "}") << " " << number(v) << "\n";
    }
  }
  for (const auto& [name, g] : gauges_) {
    out << "# HELP " << name << " " << g.first << "\n# TYPE " << name << " gauge\n"
        << name << " " << number(g.second) << "\n";
  }
  return out.str();
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

}  // namespace te::serve
