#pragma once

// What te-encoder prints and writes: the run's banner, a progress bar per epoch, the epoch and
// final lines, the per-step CSV (--log-steps) and the metrics JSON (--metrics-json).

#include <chrono>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace encoder {

using Clock = std::chrono::steady_clock;

/// printf of one number.
std::string fmt(const char* format, double v);

struct Evaluation {
  double loss = 0, accuracy = 0, mcc = 0;
  int64_t examples = 0;
};

struct RunSummary {
  double train_loss = 0, train_accuracy = 0;
  Evaluation dev, extra;
  double seconds = 0, samples_per_second = 0;
  int64_t steps = 0;
};

/// A progress bar on a terminal; plain lines about every tenth of the epoch otherwise.
class Progress {
 public:
  Progress(bool enabled, int64_t epoch, int64_t epochs, int64_t steps);
  void update(int64_t done, double loss, double acc, int64_t samples);
  void finish();

 private:
  bool enabled_, tty_;
  int64_t epoch_, epochs_, steps_;
  Clock::time_point start_;
};

/// --log-steps: one CSV line per step, written to FILE.tmp and renamed to FILE when the run ends
/// (a file that exists is a whole run's). Does nothing when `path` is empty.
class StepLog {
 public:
  explicit StepLog(const std::string& path);
  void add(int64_t step, int64_t epoch, double loss, double accuracy, double samples_per_second);
  void finish();

 private:
  std::string path_, tmp_;
  std::ofstream out_;
};

/// Writes `j` to `path` atomically (a temporary file renamed); `what` names the option.
void write_json_atomically(const nlohmann::json& j, const std::string& path, const char* what);

}  // namespace encoder
