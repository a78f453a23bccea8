#pragma once

// Running a program as a user does, for the end-to-end tests of te-encoder and te-train: its
// exit status, stdout and stderr apart.

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace te::test {

struct ProgramResult {
  int status = -1;
  std::string out, err;
};

/// Runs `program` with `args` (a shell-quoted string) and stdin from /dev/null.
inline ProgramResult run_program(const std::string& program, const std::string& args) {
  namespace fs = std::filesystem;
  static std::atomic<int> counter{0};
  const fs::path err_file =
      fs::temp_directory_path() /
      ("te_program_err_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  const std::string cmd = program + " " + args + " 2>" + err_file.string() + " </dev/null";
  ProgramResult r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return r;
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) r.out.append(buf, n);
  const int status = ::pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(err_file);
  std::stringstream ss;
  ss << in.rdbuf();
  r.err = ss.str();
  fs::remove(err_file);
  return r;
}

}  // namespace te::test
