#include "te/program/report.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "te/input_error.h"

namespace te::program {

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

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

std::string one_line(const std::string& message) {
  std::vector<std::string> lines;
  std::stringstream in(message);
  std::string line;
  while (std::getline(in, line)) {
    const auto start = line.find_first_not_of(' ');
    if (start != std::string::npos) lines.push_back(line.substr(start));
  }
  if (lines.empty()) return message;
  std::string out = lines.front();
  if (lines.size() > 1) out += "; " + lines.back();
  const auto tag = out.rfind(" [");
  if (tag != std::string::npos && out.back() == ']') out.erase(tag);
  return out;
}

Progress::Progress(bool enabled, int64_t epoch, int64_t epochs, int64_t steps, std::string unit)
    : enabled_(enabled),
      tty_(isatty(STDOUT_FILENO) != 0),
      epoch_(epoch),
      epochs_(epochs),
      steps_(steps),
      unit_(std::move(unit)),
      start_(Clock::now()) {}

void Progress::update(int64_t done, const std::vector<Stat>& figures, int64_t count) {
  if (!enabled_ || steps_ == 0) return;
  const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(count) / elapsed : 0;
  const double eta = done > 0 ? elapsed * static_cast<double>(steps_ - done) / done : 0;
  std::string stats;
  for (const Stat& s : figures) stats += s.name + " " + fmt(s.format, s.value) + " ";
  stats += fmt("%.0f", rate) + " " + unit_ + "/s ETA " + duration(eta);
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

StepLog::Cell::Cell(double v) : text_(fmt("%.9g", v)) {}

StepLog::StepLog(const std::string& path, std::vector<std::string> columns,
                 const std::string& option, int64_t carried_lines)
    : path_(path), columns_(std::move(columns)) {
  if (path_.empty()) return;
  std::string header;
  for (const auto& c : columns_) header += (header.empty() ? "" : ",") + c;
  std::vector<std::string> carried;
  if (carried_lines > 0) {
    std::ifstream before(path_);
    std::string line;
    if (std::getline(before, line) && line == header) {
      while (static_cast<int64_t>(carried.size()) < carried_lines && std::getline(before, line)) {
        carried.push_back(line);
      }
    }
  }
  tmp_ = path_ + ".tmp";
  out_.open(tmp_);
  if (!out_) throw te::InputError("cannot write " + option + " '" + path_ + "'");
  out_ << header << "\n";
  for (const std::string& line : carried) out_ << line << "\n";
}

void StepLog::add(const std::vector<Cell>& values) {
  if (!out_.is_open()) return;
  if (values.size() != columns_.size()) {
    throw std::logic_error("StepLog::add: " + std::to_string(values.size()) + " values for " +
                           std::to_string(columns_.size()) + " columns");
  }
  std::string line;
  for (const Cell& v : values) line += (line.empty() ? "" : ",") + v.text();
  out_ << line << "\n";
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

}  // namespace te::program
