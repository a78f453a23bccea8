#pragma once

// te-serve's HTTP layer inside (http.cpp alone includes it): a connection (Session) driven on the
// event loop, what a Reply reaches of it (Exchange), and the server's state (Server::Impl).

#include "te/serve/http.h"

#include <sys/resource.h>

#include <strings.h>
#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <cstdio>
#include <deque>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "te/error.h"

namespace te::serve::http {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = net::ip::tcp;
using error_code = boost::system::error_code;

// A whole response as bytes (also the form of the few the server writes on its own).
inline std::shared_ptr<bhttp::response<bhttp::string_body>> make_response(const Response& r,
                                                                          bool keep_alive,
                                                                          unsigned version) {
  auto res = std::make_shared<bhttp::response<bhttp::string_body>>(
      static_cast<bhttp::status>(r.status), version);
  res->set(bhttp::field::content_type, r.content_type);
  for (const auto& [name, value] : r.headers) res->set(name, value);
  res->keep_alive(keep_alive);
  res->body() = r.body;
  res->prepare_payload();
  return res;
}

class Session;

// What a Reply reaches: its connection (gone once closed), whether the client has gone, and the
// handler's on_gone callback.
struct Exchange {
  std::weak_ptr<Session> session;
  net::io_context* io = nullptr;
  std::atomic<bool> gone{false};
  std::mutex mu;
  std::function<void()> on_gone;
  bool answered = false;  // io thread only: send() or end() has been taken
};

struct Server::Impl {
  explicit Impl(ServerOptions o)
      : options(std::move(o)),
        acceptor(io),
        pool(std::max(1, options.worker_threads)),
        work(io.get_executor()) {}

  ServerOptions options;
  net::io_context io;
  tcp::acceptor acceptor;
  net::thread_pool pool;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  struct Route {
    Handler handler;
    bool inline_ = false;  // runs on the io thread (cheap, never blocks)
  };
  std::map<std::pair<std::string, std::string>, Route> routes;
  // io thread only
  std::set<std::shared_ptr<Session>> sessions;
  int64_t refused_open = 0;  // sessions answering 503 (not counted against the cap)
  bool stopping = false;
  std::optional<net::steady_timer> grace_timer;
  std::optional<net::steady_timer> accept_retry;

  void accept();
  void closed(const std::shared_ptr<Session>& s);
  void count(const std::string& name, const std::string& help, const std::string& labels = "") {
    if (options.metrics) options.metrics->count(name, help, 1, labels);
  }
  void gauge_open() {
    if (options.metrics) {
      options.metrics->set_gauge("te_serve_connections_open", "Open HTTP connections.",
                                 static_cast<double>(served()));
    }
  }
  std::string error_body(int status, const std::string& message) const {
    return options.error_body ? options.error_body(status, message) : message;
  }
  int64_t served() const { return static_cast<int64_t>(sessions.size()) - refused_open; }
};

// One connection, driven on the io thread: wait for a request (deadlines), read it, hand it to its
// handler on the pool, write the answer (whole or chunked), and again while keep-alive lasts.
class Session : public std::enable_shared_from_this<Session> {
 public:
  enum class Phase { kHeader, kKeepAlive, kBody, kHandling, kWriting, kClosing };

  Session(Server::Impl& server, tcp::socket socket)
      : server_(server), socket_(std::move(socket)), timer_(server.io) {}

  void start() { read_request(/*first=*/true); }

  // A connection beyond --max-connections: one 503, then closed.
  void refuse() {
    refused_ = true;
    ++server_.refused_open;
    phase_ = Phase::kHandling;
    keep_alive_ = false;
    Response r;
    r.status = 503;
    r.body = server_.error_body(
        503, std::to_string(server_.options.max_connections) +
                 " connections are open, the most this server keeps (--max-connections); "
                 "retry later");
    r.headers.emplace_back("Retry-After", "1");
    queue_whole(r, "");
  }

  // Shutdown: idle connections and those still sending headers close now, the others after their
  // answer.
  void stop() {
    keep_alive_ = false;
    if (phase_ == Phase::kHeader || phase_ == Phase::kKeepAlive) close();
  }
  void close() {
    if (closed_) return;
    closed_ = true;
    phase_ = Phase::kClosing;
    timer_.cancel();
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    if (streaming_ && exchange_ && !exchange_->answered) count_request();  // a stream cut short
    client_gone();
    if (refused_) --server_.refused_open;
    server_.closed(shared_from_this());
  }

  // ---- called through a Reply (io thread) ----
  void send(const std::shared_ptr<Exchange>& x, const Response& r) {
    if (x != exchange_ || x->answered || closed_) return;
    if (streaming_) {  // a whole answer cannot follow a stream's head: the stream is cut
      close();
      return;
    }
    x->answered = true;
    queue_whole(r, path_);
  }
  void fail(const std::shared_ptr<Exchange>& x, int status, const std::string& message) {
    Response r;
    r.status = status;
    r.body = server_.error_body(status, message);
    send(x, r);
  }
  void open_stream(const std::shared_ptr<Exchange>& x, const Response& head) {
    if (x != exchange_ || x->answered || streaming_ || closed_) return;
    streaming_ = true;
    status_ = head.status;
    auto h = std::make_shared<bhttp::response<bhttp::empty_body>>(
        static_cast<bhttp::status>(head.status), version_);
    h->set(bhttp::field::content_type, head.content_type);
    for (const auto& [name, value] : head.headers) h->set(name, value);
    // HTTP/1.0 has no chunks: the body runs to the connection's end.
    if (version_ < 11) keep_alive_ = false;
    h->keep_alive(keep_alive_);
    h->chunked(version_ >= 11);
    Out o;
    o.head = std::move(h);
    out_.push_back(std::move(o));
    if (!head.body.empty()) write_chunk(x, head.body);
    pump();
  }
  void write_chunk(const std::shared_ptr<Exchange>& x, std::string chunk) {
    if (x != exchange_ || x->answered || !streaming_ || closed_ || chunk.empty()) return;
    Out o;
    o.chunk = std::move(chunk);
    out_.push_back(std::move(o));
    pump();
  }
  void end(const std::shared_ptr<Exchange>& x) {
    if (x != exchange_ || x->answered || !streaming_ || closed_) return;
    x->answered = true;
    Out o;
    o.last = true;
    out_.push_back(std::move(o));
    pump();
  }

 private:
  // One write: a whole response, a stream's head, one chunk, or the last chunk.
  struct Out {
    std::shared_ptr<bhttp::response<bhttp::string_body>> whole;
    std::shared_ptr<bhttp::response<bhttp::empty_body>> head;
    std::string chunk;
    bool last = false;
  };

  void arm(std::chrono::milliseconds after, Phase phase) {
    timer_.expires_after(after);
    const uint64_t generation = ++timer_generation_;
    timer_.async_wait([self = shared_from_this(), generation, phase](error_code ec) {
      if (ec || generation != self->timer_generation_ || self->closed_) return;
      self->deadline(phase);
    });
  }
  void disarm() {
    ++timer_generation_;
    timer_.cancel();
  }

  void deadline(Phase phase) {
    timed_out_ = true;
    switch (phase) {
      case Phase::kKeepAlive:
        server_.count("te_serve_connection_timeouts_total",
                      "Connections closed by a deadline, by what was late.",
                      "phase=\"keep_alive\"");
        close();
        return;
      case Phase::kHeader:
      case Phase::kBody: {
        const bool header = phase == Phase::kHeader;
        server_.count("te_serve_connection_timeouts_total",
                      "Connections closed by a deadline, by what was late.",
                      header ? "phase=\"header\"" : "phase=\"body\"");
        if (header && !parser_->got_some() && buffer_.size() == 0) {
          close();  // it sent nothing (a preconnect): no answer it would take for another's
          return;
        }
        error_code ec;
        socket_.cancel(ec);  // the pending read ends; its handler sees timed_out_
        answer_error(408, header
                              ? "the request's headers did not arrive within " +
                                    seconds(server_.options.header_timeout) + " (--header-timeout)"
                              : "the request's body did not arrive within " +
                                    seconds(server_.options.body_timeout) + " (--body-timeout)");
        return;
      }
      case Phase::kClosing:
        close();
        return;
      default:  // a write the client does not read
        server_.count("te_serve_connection_timeouts_total",
                      "Connections closed by a deadline, by what was late.", "phase=\"write\"");
        close();
    }
  }
  static std::string seconds(std::chrono::milliseconds ms) {
    char text[32];
    std::snprintf(text, sizeof(text), "%g s", static_cast<double>(ms.count()) / 1000.0);
    return text;
  }

  // Waits for the next request: its first byte within keep_alive_timeout (a new connection: its
  // headers within header_timeout), then its headers within header_timeout of that byte.
  void read_request(bool first);
  void read_header();
  void on_header(error_code ec);
  void on_body(error_code ec);
  void body_too_large();
  // An error the server answers itself; the connection closes after it (what the client still
  // sends is read and dropped for a moment, so the answer is not lost to a reset).
  void answer_error(int status, const std::string& message);
  // A whole request is here: its handler runs on the pool.
  void dispatch();

  // While a request is handled: a client that closes its end is gone (its request is cancelled
  // through on_gone). Bytes of a pipelined next request stay unread until the answer is out.
  void watch() {
    socket_.async_wait(tcp::socket::wait_read,
                       [self = shared_from_this(), x = exchange_](error_code ec) {
                         if (ec || self->closed_ || x != self->exchange_) return;
                         error_code e;
                         const std::size_t available = self->socket_.available(e);
                         if (e || available == 0) {
                           self->close();  // end of stream or an error: nobody reads the answer
                         }
                       });
  }

  void queue_whole(const Response& r, const std::string& path) {
    status_ = r.status;
    path_ = path;
    Out o;
    o.whole = make_response(r, keep_alive_, version_);
    if (head_only_) {  // the length the body would have, without it
      o.whole->body().clear();
      o.whole->content_length(r.body.size());
    }
    out_.push_back(std::move(o));
    pump();
  }

  void pump() {
    if (writing_ || closed_ || out_.empty()) return;
    writing_ = true;
    arm(server_.options.write_timeout, Phase::kWriting);
    Out& o = out_.front();
    auto done = [self = shared_from_this()](error_code ec, std::size_t) { self->written(ec); };
    if (o.whole) {
      bhttp::async_write(socket_, *o.whole, std::move(done));
    } else if (o.head) {
      head_serializer_.emplace(*o.head);
      bhttp::async_write_header(socket_, *head_serializer_, std::move(done));
    } else if (version_ < 11) {  // HTTP/1.0: the bytes as they are; the end is the close
      net::async_write(socket_, net::buffer(o.chunk), std::move(done));
    } else if (o.last) {
      net::async_write(socket_, bhttp::make_chunk_last(), std::move(done));
    } else {
      net::async_write(socket_, bhttp::make_chunk(net::buffer(o.chunk)), std::move(done));
    }
  }
  void written(error_code ec) {
    writing_ = false;
    if (closed_) return;
    if (ec) {
      close();
      return;
    }
    const bool complete = out_.front().whole || out_.front().last;
    out_.pop_front();
    if (!complete) {
      if (out_.empty()) disarm();  // a stream waiting for its next piece
      pump();
      return;
    }
    disarm();
    answered();
    if (!keep_alive_) {
      linger_close();
      return;
    }
    // The watch on the socket (if pending) ends; the next request is read.
    error_code e;
    socket_.cancel(e);
    read_request(false);
  }
  void answered() {
    if (exchange_) exchange_->answered = true;
    count_request();
  }
  // Counts the request (by path and status) once its answer is written or cut short.
  void count_request() {
    if (server_.options.metrics && status_ > 0 && !path_.empty()) {
      server_.options.metrics->request(path_, status_);
    }
  }

  // Half-closes and reads what the client still sends for up to a second, then closes.
  void linger_close() {
    error_code ec;
    socket_.cancel(ec);
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    phase_ = Phase::kClosing;
    arm(std::chrono::milliseconds(1000), Phase::kClosing);
    drain();
  }
  void drain() {
    socket_.async_read_some(net::buffer(sink_),
                            [self = shared_from_this()](error_code ec, std::size_t) {
                              if (self->closed_) return;
                              if (ec) return self->close();
                              self->drain();
                            });
  }

  void client_gone() {
    std::shared_ptr<Exchange> x = std::move(exchange_);
    if (!x || x->answered) return;
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(x->mu);
      x->gone = true;
      fn = std::move(x->on_gone);
    }
    if (fn) fn();
  }

  friend class Reply;
  Server::Impl& server_;
  tcp::socket socket_;
  net::steady_timer timer_;
  uint64_t timer_generation_ = 0;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::optional<bhttp::response_serializer<bhttp::empty_body>> head_serializer_;
  std::deque<Out> out_;
  std::shared_ptr<Exchange> exchange_;
  std::string path_;
  std::array<char, 4096> sink_{};
  Phase phase_ = Phase::kHeader;
  int status_ = 0;
  unsigned version_ = 11;
  bool keep_alive_ = true, streaming_ = false, writing_ = false, closed_ = false,
       timed_out_ = false, refused_ = false, head_only_ = false;
};

}  // namespace te::serve::http
