#pragma once

// te-serve's counters, gauges and histograms, rendered in Prometheus' text format (GET /metrics).

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace te::serve {

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

/// The resident set size of this process (VmRSS), in bytes; 0 when unknown.
int64_t resident_bytes();

}  // namespace te::serve
