#pragma once

// What a training program prints and writes: numbers and durations, a library message in one
// line, a progress bar per epoch, the per-step CSV (--log-steps) and JSON written atomically
// (--metrics-json).

#include <chrono>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <type_traits>
#include <vector>

namespace te::program {

using Clock = std::chrono::steady_clock;

/// printf of one number: fmt("%.4f", 0.5) is "0.5000".
std::string fmt(const char* format, double v);

/// A duration for a person: "42s", "3m07s", "2h05m".
std::string duration(double seconds);

/// A library message for the command line: one line (a parse error's caret picture dropped,
/// its explanation kept), without the [file:line] tag.
std::string one_line(const std::string& message);

/// One figure of a progress line: "loss 0.1234" is {"loss", 0.1234} (printf `format`).
struct Stat {
  std::string name;
  double value = 0;
  const char* format = "%.4f";
};

/// A progress bar on a terminal; plain lines about every tenth of the epoch otherwise. Each
/// shows the stats given, the rate in `unit`s per second and the epoch's ETA.
class Progress {
 public:
  Progress(bool enabled, int64_t epoch, int64_t epochs, int64_t steps,
           std::string unit = "samples");
  /// After `done` of the epoch's steps, which covered `count` units (e.g. samples).
  void update(int64_t done, const std::vector<Stat>& stats, int64_t count);
  /// Clears the bar (on a terminal).
  void finish();

 private:
  bool enabled_, tty_;
  int64_t epoch_, epochs_, steps_;
  std::string unit_;
  Clock::time_point start_;
};

/// --log-steps: a CSV with the given header columns and one line per step, written to FILE.tmp
/// and renamed to FILE when the run ends (a file that exists is a whole run's). Does nothing
/// when `path` is empty. te::InputError naming `option` when FILE.tmp cannot be written.
class StepLog {
 public:
  /// One value of a line: an integer as is, a double with %.9g, text as is (fmt() for another
  /// format).
  class Cell {
   public:
    template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
    Cell(T v) : text_(std::to_string(static_cast<long long>(v))) {}  // NOLINT: implicit
    Cell(double v);                                                  // NOLINT: implicit
    Cell(std::string text) : text_(std::move(text)) {}               // NOLINT: implicit
    Cell(const char* text) : text_(text) {}                          // NOLINT: implicit
    const std::string& text() const { return text_; }

   private:
    std::string text_;
  };

  /// With `carried_lines` > 0 (a resumed run that did that many steps before), the first that
  /// many lines of an existing file at `path` with the same header are kept ahead of the new
  /// ones, so a resumed run's log holds every step once (lines of steps past the checkpoint,
  /// which run again, are dropped).
  StepLog(const std::string& path, std::vector<std::string> columns,
          const std::string& option = "--log-steps", int64_t carried_lines = 0);
  /// One line: a value per column, in the header's order.
  void add(const std::vector<Cell>& values);
  /// Closes the file and renames it into place.
  void finish();

 private:
  std::string path_, tmp_;
  std::vector<std::string> columns_;
  std::ofstream out_;
};

/// Writes `j` to `path` atomically (a temporary file renamed); `what` names the option.
void write_json_atomically(const nlohmann::json& j, const std::string& path, const char* what);

}  // namespace te::program
