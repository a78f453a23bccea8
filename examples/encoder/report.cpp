#include "report.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "te/encoder/text.h"

namespace encoder {

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

namespace {

std::string duration(double seconds) {
  const int s = static_cast<int>(std::lround(seconds));
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%dh%02dm", s / 3600, (s / 60) % 60);
  } else if (s >= 60) {
    std::snprintf(buf, sizeof(buf), "%dm%02ds", s / 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%ds", s);
  }
  return buf;
}

}  // namespace

Progress::Progress(bool enabled, int64_t epoch, int64_t epochs, int64_t steps)
    : enabled_(enabled),
      tty_(isatty(STDOUT_FILENO) != 0),
      epoch_(epoch),
      epochs_(epochs),
      steps_(steps),
      start_(Clock::now()) {}

void Progress::update(int64_t done, double loss, double acc, int64_t samples) {
  if (!enabled_ || steps_ == 0) return;
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(samples) / elapsed : 0;
  const double eta = done > 0 ? elapsed * static_cast<double>(steps_ - done) / done : 0;
  const std::string stats = "loss " + fmt("%.4f", loss) + " acc " + fmt("%.4f", acc) + " " +
                            fmt("%.0f", rate) + " samples/s ETA " + duration(eta);
  if (tty_) {
    const int width = 30;
    const int filled = static_cast<int>(width * done / steps_);
    std::cout << "\repoch " << epoch_ << "/" << epochs_ << " ["
              << std::string(static_cast<std::size_t>(filled), '#')
              << std::string(static_cast<std::size_t>(width - filled), '.') << "] " << done << "/"
              << steps_ << " " << stats << "\033[K" << std::flush;
  } else {
    const int64_t every = std::max<int64_t>(1, steps_ / 10);
    if (done % every == 0 || done == steps_) {
      std::cout << "  epoch " << epoch_ << " step " << done << "/" << steps_ << ": " << stats
                << std::endl;
    }
  }
}

void Progress::finish() {
  if (enabled_ && tty_) std::cout << "\r\033[K" << std::flush;
}

StepLog::StepLog(const std::string& path) : path_(path) {
  if (path_.empty()) return;
  tmp_ = path_ + ".tmp";
  out_.open(tmp_);
  if (!out_) throw InputError("cannot write --log-steps '" + path_ + "'");
  out_ << "step,epoch,loss,accuracy,samples_per_second\n";
}

void StepLog::add(int64_t step, int64_t epoch, double loss, double accuracy,
                  double samples_per_second) {
  if (!out_.is_open()) return;
  char line[160];
  std::snprintf(line, sizeof(line), "%lld,%lld,%.9g,%.9g,%.1f\n", static_cast<long long>(step),
                static_cast<long long>(epoch), loss, accuracy, samples_per_second);
  out_ << line;
}

void StepLog::finish() {
  if (!out_.is_open()) return;
  out_.close();
  std::filesystem::rename(tmp_, path_);
}

void write_json_atomically(const nlohmann::json& j, const std::string& path, const char* what) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    if (!out) throw std::runtime_error(std::string("cannot write ") + what + " '" + path + "'");
    out << j.dump(2) << "\n";
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace encoder
