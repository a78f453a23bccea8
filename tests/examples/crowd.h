#pragma once

// Raw loopback connections for te-serve's connection tests and bench/bench_serve_load's --crowd:
// a connection, its bytes, and the Crowd of clients that hold connections without being served.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace te::test {

/// A raw TCP connection to 127.0.0.1:`port` (-1 when it could not be made).
inline int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

inline bool send_all(int fd, const std::string& data) {
  std::size_t at = 0;
  while (at < data.size()) {
    const ssize_t n = ::send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += static_cast<std::size_t>(n);
  }
  return true;
}

/// What the server sends on `fd` until it closes the connection or `timeout` passes; `closed`
/// says which.
inline std::string read_until_closed(int fd, std::chrono::milliseconds timeout, bool* closed) {
  std::string out;
  *closed = false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return out;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return out;
    char buf[4096];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) {
      *closed = true;
      return out;
    }
    out.append(buf, static_cast<std::size_t>(n));
  }
}

/// Clients that hold a server's connections without being served: `slow` that send a request's
/// header lines one per second and never finish them (slowloris), and `idle` that made one
/// request (GET /healthz) and keep their keep-alive connection open.
class Crowd {
 public:
  Crowd(int port, int slow, int idle) {
    for (int i = 0; i < idle; ++i) {
      const int fd = connect_to(port);
      if (fd < 0) break;
      idle_.push_back(fd);
      send_all(fd, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    }
    for (int fd : idle_) {  // each reads its answer; the connection stays open
      std::string head;
      char buf[4096];
      while (head.find("\"ok\"}") == std::string::npos) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 10000) <= 0) break;
        const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        head.append(buf, static_cast<std::size_t>(n));
      }
      if (head.rfind("HTTP/1.1 200", 0) == 0) ++idle_answered_;
    }
    for (int i = 0; i < slow; ++i) {
      const int fd = connect_to(port);
      if (fd < 0) break;
      slow_.push_back(fd);
      send_all(fd, "POST /v1/classify HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    }
    trickle_ = std::thread([this] {
      for (int line = 0; !stop_.load(); ++line) {
        for (int i = 0; i < 10 && !stop_.load(); ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        for (int fd : slow_) send_all(fd, "X-Line-" + std::to_string(line) + ": 1\r\n");
      }
    });
  }
  ~Crowd() {
    stop_trickling();
    for (int fd : slow_) ::close(fd);
    for (int fd : idle_) ::close(fd);
  }
  void stop_trickling() {
    stop_ = true;
    if (trickle_.joinable()) trickle_.join();
  }
  const std::vector<int>& slow() const { return slow_; }
  const std::vector<int>& idle() const { return idle_; }
  /// Idle connections whose GET /healthz was answered 200.
  int idle_answered() const { return idle_answered_; }

 private:
  std::vector<int> slow_, idle_;
  int idle_answered_ = 0;
  std::atomic<bool> stop_{false};
  std::thread trickle_;
};

/// A request's seconds alone and beside a Crowd, and the crowd, still open.
struct Crowded {
  double unloaded = 0;  ///< the least of three alone (after one to warm up)
  double loaded = 0;    ///< the most of three with the crowd open
  std::chrono::steady_clock::time_point opened;  ///< when the crowd was whole
  std::unique_ptr<Crowd> crowd;
};

/// Times `measure()` (it returns a request's seconds) alone, then opens a Crowd of `slow` and
/// `idle` clients on `port` and times it beside them.
inline Crowded measure_beside_crowd(int port, int slow, int idle,
                                    const std::function<double()>& measure) {
  Crowded c;
  measure();  // the first request's allocations
  c.unloaded = 1e9;
  for (int i = 0; i < 3; ++i) c.unloaded = std::min(c.unloaded, measure());
  c.crowd = std::make_unique<Crowd>(port, slow, idle);
  c.opened = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) c.loaded = std::max(c.loaded, measure());
  return c;
}

}  // namespace te::test
