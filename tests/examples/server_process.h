#pragma once

// A te-serve process for the serving tests (TE_SERVE_PATH): started on a free loopback port,
// its output read until it says where it listens, stopped by a signal; and the checks of an
// error answer.

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "crowd.h"

namespace te::test {

// Runs a command to its end; returns the exit code and stdout+stderr.
inline std::pair<int, std::string> run(const std::string& cmd) {
  std::string out;
  FILE* pipe = ::popen((cmd + " 2>&1 </dev/null").c_str(), "r");
  if (pipe == nullptr) return {-1, out};
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

inline std::string shell_quoted(const std::string& s) { return "'" + s + "'"; }

// A te-serve process; its stdout is read until it says where it listens.
class Server {
 public:
  explicit Server(const std::vector<std::string>& args) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      std::vector<std::string> all = {TE_SERVE_PATH, "--port", "0"};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = ::fdopen(fds[0], "r");
    char line[4096];
    while (std::fgets(line, sizeof(line), out_) != nullptr) {
      log_ += line;
      const std::string text = line;
      const auto at = text.find("listening on http://127.0.0.1:");
      if (at != std::string::npos) {
        port_ = std::stoi(text.substr(at + 30));
        break;
      }
    }
  }
  ~Server() {
    if (pid_ > 0 && !stopped_) stop(SIGKILL);
    if (out_ != nullptr) std::fclose(out_);
  }

  int port() const { return port_; }
  const std::string& log() const { return log_; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60, 0);
    return c;
  }
  /// Sends `sig`, reads the rest of the output, returns the exit code.
  int stop(int sig = SIGTERM) {
    ::kill(pid_, sig);
    char line[4096];
    while (out_ != nullptr && std::fgets(line, sizeof(line), out_) != nullptr) log_ += line;
    int status = 0;
    ::waitpid(pid_, &status, 0);
    stopped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  int port_ = -1;
  bool stopped_ = false;
  std::string log_;
};

/// `r` is an answer with `status` and OpenAI's error object {"error": {"message", "type", "param",
/// "code"}} whose message contains `words`.
inline void expect_error(const httplib::Result& r, int status, const std::string& words) {
  ASSERT_TRUE(r) << "no response (" << httplib::to_string(r.error()) << ")";
  EXPECT_EQ(r->status, status) << r->body;
  const nlohmann::json body = nlohmann::json::parse(r->body, nullptr, false);
  ASSERT_TRUE(body.is_object() && body.contains("error") && body["error"].is_object() &&
              body["error"]["message"].is_string() && body["error"]["type"].is_string() &&
              body["error"].contains("param") && body["error"].contains("code"))
      << "not OpenAI's error object: " << r->body;
  EXPECT_NE(body["error"]["message"].get<std::string>().find(words), std::string::npos)
      << "error " << body["error"]["message"] << " should name: " << words;
}

/// expect_error, and OpenAI's "param" is `param` (null when "").
inline void expect_openai_error(const httplib::Result& r, int status, const std::string& param,
                                const std::string& words) {
  expect_error(r, status, words);
  if (!r) return;
  const nlohmann::json body = nlohmann::json::parse(r->body, nullptr, false);
  if (!body.is_object() || !body.contains("error") || !body["error"].is_object()) return;
  EXPECT_EQ(body["error"]["param"], param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param))
      << r->body;
}

/// The value of the Prometheus sample `line` (e.g. `te_serve_connections_open`) in `metrics`,
/// or -1 when it is not there.
inline double metric_value(const std::string& metrics, const std::string& line) {
  const std::size_t at = metrics.find("\n" + line + " ");
  if (at == std::string::npos) return -1;
  return std::stod(metrics.substr(at + line.size() + 2));
}

}  // namespace te::test
