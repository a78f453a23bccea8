#include <sys/resource.h>

#include <boost/asio/ip/address.hpp>
#include <iostream>

#include "http_session.h"

namespace te::serve::http {

std::string Request::header(const std::string& name) const {
  for (const auto& [n, v] : headers) {
    if (::strcasecmp(n.c_str(), name.c_str()) == 0) return v;
  }
  return "";
}

// ---- Reply: posts onto the io thread ----------------------------------------------------------

namespace {
template <typename Fn>
void on_session(const std::shared_ptr<Exchange>& x, Fn fn) {
  // A connection that has ended (and with the last of them, the server) is not posted to.
  if (!x || x->gone || x->session.expired()) return;
  net::post(*x->io, [x, fn = std::move(fn)]() mutable {
    if (auto s = x->session.lock()) {
      try {
        fn(*s);
      } catch (const std::exception& e) {  // e.g. a stream's reader: the stream is cut
        std::cerr << "te-serve: a response failed: " << e.what() << std::endl;
        s->close();
      }
    }
  });
}
}  // namespace

void Reply::send(Response response) const {
  on_session(exchange_, [x = exchange_, r = std::move(response)](Session& s) { s.send(x, r); });
}
void Reply::open_stream(Response head) const {
  on_session(exchange_, [x = exchange_, h = std::move(head)](Session& s) { s.open_stream(x, h); });
}
bool Reply::write(std::string chunk) const {
  if (gone()) return false;
  on_session(exchange_, [x = exchange_, c = std::move(chunk)](Session& s) mutable {
    s.write_chunk(x, std::move(c));
  });
  return true;
}
void Reply::fail(int status, std::string message) const {
  on_session(exchange_,
             [x = exchange_, status, m = std::move(message)](Session& s) { s.fail(x, status, m); });
}
void Reply::end() const {
  on_session(exchange_, [x = exchange_](Session& s) { s.end(x); });
}
void Reply::post(std::function<void()> fn) const {
  on_session(exchange_, [fn = std::move(fn)](Session&) { fn(); });
}
void Reply::on_gone(std::function<void()> fn) const {
  {
    std::lock_guard<std::mutex> lock(exchange_->mu);
    if (!exchange_->gone) {
      exchange_->on_gone = std::move(fn);
      return;
    }
  }
  fn();
}
bool Reply::gone() const { return exchange_->gone; }

// ---- the server -------------------------------------------------------------------------------

void Server::Impl::accept() {
  acceptor.async_accept(io, [this](error_code ec, tcp::socket socket) {
    if (stopping) return;
    if (ec) {
      count("te_serve_accept_errors_total", "Connections that could not be accepted.");
      // Out of file descriptors or memory: try again in a moment; any other failure is the
      // one connection's (it reset before it was taken), and the next is taken at once.
      if (ec == net::error::no_descriptors || ec.value() == ENFILE ||
          ec == net::error::no_buffer_space || ec == net::error::no_memory) {
        accept_retry.emplace(io, std::chrono::milliseconds(50));
        accept_retry->async_wait([this](error_code e) {
          if (!e && !stopping) accept();
        });
      } else {
        accept();
      }
      return;
    }
    error_code e;
    socket.set_option(tcp::no_delay(true), e);
    auto session = std::make_shared<Session>(*this, std::move(socket));
    sessions.insert(session);
    if (served() > options.max_connections) {
      count("te_serve_connections_refused_total",
            "Connections answered 503 because --max-connections were open.");
      session->refuse();
    } else {
      gauge_open();
      session->start();
    }
    accept();
  });
}

void Server::Impl::closed(const std::shared_ptr<Session>& s) {
  sessions.erase(s);
  gauge_open();
  if (stopping && sessions.empty()) {
    if (grace_timer) grace_timer->cancel();
    work.reset();
  }
}

Server::Server(ServerOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}

Server::~Server() { impl_->pool.join(); }

void Server::route(const std::string& method, const std::string& path, Handler handler, Run run) {
  impl_->routes[{method, path}] = {std::move(handler), run == Run::kInline};
}

namespace {
// Room for `connections` sockets beside the process's other files (model files, the listening
// socket, Gloo's): the soft open-file limit is raised as far as the hard one allows. The number of
// connections that fit: all of them, or fewer when the hard limit is lower.
int64_t fit_open_files(int64_t connections) {
  constexpr int64_t kOtherFiles = 256;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) return connections;
  const int64_t wanted = connections + kOtherFiles;
  if (limit.rlim_cur != RLIM_INFINITY && static_cast<int64_t>(limit.rlim_cur) < wanted) {
    rlimit raised = limit;
    raised.rlim_cur = limit.rlim_max == RLIM_INFINITY
                          ? static_cast<rlim_t>(wanted)
                          : std::min<rlim_t>(limit.rlim_max, static_cast<rlim_t>(wanted));
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) limit = raised;
  }
  if (limit.rlim_cur == RLIM_INFINITY) return connections;
  return std::min(connections, static_cast<int64_t>(limit.rlim_cur) - kOtherFiles);
}
}  // namespace

int Server::bind() {
  ServerOptions& o = impl_->options;
  if (o.max_connections <= 0) {
    o.max_connections = std::max<int64_t>(1, fit_open_files(4096));
  } else if (const int64_t fit = fit_open_files(o.max_connections); fit < o.max_connections) {
    throw te::Error("--max-connections " + std::to_string(o.max_connections) +
                    " needs more open files than this process may have (ulimit -n allows " +
                    std::to_string(std::max<int64_t>(fit, 0)) +
                    " connections); lower it or raise the limit");
  }
  error_code ec;
  tcp::resolver resolver(impl_->io);
  const auto endpoints = resolver.resolve(o.host, std::to_string(o.port), ec);
  if (ec || endpoints.empty()) {
    throw te::Error("cannot listen on " + o.host + ":" + std::to_string(o.port) + " (" +
                    (ec ? ec.message() : "no address") + "); choose another --host/--port");
  }
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  tcp::acceptor& a = impl_->acceptor;
  a.open(endpoint.protocol(), ec);
  if (!ec) a.set_option(tcp::acceptor::reuse_address(true), ec);  // not SO_REUSEPORT
  if (!ec) a.bind(endpoint, ec);
  // A deep accept queue: a burst of connections is not made to retry its SYNs.
  if (!ec) a.listen(SOMAXCONN, ec);
  if (ec) {
    throw te::Error("cannot listen on " + o.host + ":" + std::to_string(o.port) + " (" +
                    ec.message() +
                    "; in use, or not an address of this machine); choose another "
                    "--host/--port");
  }
  return a.local_endpoint().port();
}

void Server::run() {
  net::post(impl_->io, [impl = impl_.get()] {
    if (!impl->stopping) impl->accept();  // a shutdown() before run() stops it at once
  });
  for (;;) {
    try {
      impl_->io.run();
      return;
    } catch (const std::exception& e) {  // a bug in one connection's handling: the rest go on
      std::cerr << "te-serve: error on the HTTP thread: " << e.what() << std::endl;
    }
  }
}

void Server::shutdown(std::chrono::milliseconds grace) {
  net::post(impl_->io, [impl = impl_.get(), grace] {
    if (impl->stopping) return;
    impl->stopping = true;
    error_code ec;
    impl->acceptor.close(ec);
    if (impl->accept_retry) impl->accept_retry->cancel();
    const auto open = impl->sessions;  // stop() may close and erase
    for (const auto& s : open) s->stop();
    if (impl->sessions.empty()) {
      impl->work.reset();
      return;
    }
    impl->grace_timer.emplace(impl->io, grace);
    impl->grace_timer->async_wait([impl](error_code e) {
      if (e) return;
      const auto left = impl->sessions;
      for (const auto& s : left) s->close();
    });
  });
}

}  // namespace te::serve::http
