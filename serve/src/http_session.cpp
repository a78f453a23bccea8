#include "http_session.h"

namespace te::serve::http {

// ---- reading a request (the io thread) -------------------------------------------------------

// Waits for the next request: its first byte within keep_alive_timeout (a new connection: its
// headers within header_timeout), then its headers within header_timeout of that byte.
void Session::read_request(bool first) {
  if (closed_) return;
  if (server_.stopping && !first) {
    close();
    return;
  }
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(server_.options.max_header_bytes));
  parser_->body_limit(server_.options.max_body_bytes);
  exchange_.reset();
  streaming_ = false;
  head_only_ = false;
  status_ = 0;
  path_.clear();
  timed_out_ = false;
  if (first || buffer_.size() > 0) {
    read_header();
    return;
  }
  phase_ = Phase::kKeepAlive;
  arm(server_.options.keep_alive_timeout, Phase::kKeepAlive);
  socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
    if (ec || self->closed_ || self->timed_out_) return;
    self->read_header();
  });
}

void Session::read_header() {
  phase_ = Phase::kHeader;
  arm(server_.options.header_timeout, Phase::kHeader);
  bhttp::async_read_header(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](error_code ec, std::size_t) { self->on_header(ec); });
}

void Session::on_header(error_code ec) {
  if (closed_ || timed_out_) return;
  if (ec) {
    if (ec == bhttp::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted) {
      close();
    } else if (ec == bhttp::error::body_limit) {  // its Content-Length says so
      body_too_large();
    } else if (ec == bhttp::error::header_limit) {
      answer_error(431, "the request's headers are over " +
                            std::to_string(server_.options.max_header_bytes) + " bytes");
    } else {
      answer_error(400, "not an HTTP/1.1 request (" + ec.message() + ")");
    }
    return;
  }
  const auto& req = parser_->get();
  keep_alive_ = req.keep_alive() && !server_.stopping;
  version_ = req.version() >= 11 ? 11 : 10;
  path_ = std::string(req.target());
  path_ = path_.substr(0, path_.find('?'));
  const auto length = parser_->content_length();
  if (length && *length > server_.options.max_body_bytes) {
    body_too_large();
    return;
  }
  if (parser_->is_done()) {
    dispatch();
    return;
  }
  phase_ = Phase::kBody;
  arm(server_.options.body_timeout, Phase::kBody);
  if (beast::iequals(req[bhttp::field::expect], "100-continue")) {
    // 25 bytes into a socket that has sent nothing back yet: written at once.
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    error_code e;
    net::write(socket_, net::buffer(kContinue), e);
    if (e) return close();
  }
  bhttp::async_read(socket_, buffer_, *parser_,
                    [self = shared_from_this()](error_code ec, std::size_t) { self->on_body(ec); });
}

void Session::on_body(error_code ec) {
  if (closed_ || timed_out_) return;
  if (ec == bhttp::error::body_limit) return body_too_large();
  if (ec) {
    if (ec == net::error::eof || ec == bhttp::error::partial_message ||
        ec == net::error::connection_reset || ec == net::error::operation_aborted) {
      close();
    } else {
      answer_error(400, "the request's body could not be read (" + ec.message() + ")");
    }
    return;
  }
  dispatch();
}

void Session::body_too_large() {
  keep_alive_ = false;
  if (path_.empty()) {
    path_ = std::string(parser_->get().target());
    path_ = path_.substr(0, path_.find('?'));
  }
  answer_error(413, "the body is over " + std::to_string(server_.options.max_body_bytes) +
                        " bytes (--max-body-bytes); split the request");
}

// An error the server answers itself; the connection closes after it (what the client still
// sends is read and dropped for a moment, so the answer is not lost to a reset).
void Session::answer_error(int status, const std::string& message) {
  keep_alive_ = false;
  exchange_.reset();
  Response r;
  r.status = status;
  r.body = server_.error_body(status, message);
  phase_ = Phase::kHandling;
  queue_whole(r, path_);  // counted as a request only when its path was read
}

// A whole request is here: its handler runs on the pool.
void Session::dispatch() {
  disarm();
  phase_ = Phase::kHandling;
  auto message = parser_->release();
  Request request;
  request.method = std::string(message.method_string());
  request.target = std::string(message.target());
  request.path = request.target.substr(0, request.target.find('?'));
  for (const auto& field : message) {
    request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  request.body = std::move(message.body());
  path_ = request.path;
  // HEAD is GET without the body (RFC 9110 9.3.2): the GET route answers, the header goes out.
  head_only_ = message.method() == bhttp::verb::head;
  exchange_ = std::make_shared<Exchange>();
  exchange_->session = weak_from_this();
  exchange_->io = &server_.io;
  watch();
  const std::string method = head_only_ ? "GET" : request.method;
  auto route = server_.routes.find({method, request.path});
  if (route == server_.routes.end()) {  // the longest "/prefix/*" with a path below it
    std::size_t longest = 0;
    for (auto r = server_.routes.begin(); r != server_.routes.end(); ++r) {
      const std::string& p = r->first.second;
      const bool prefix = p.size() >= 2 && p.compare(p.size() - 2, 2, "/*") == 0;
      if (r->first.first != method || !prefix || p.size() <= longest) continue;
      const std::size_t stem = p.size() - 1;  // through the '/'
      if (request.path.size() > stem && request.path.compare(0, stem, p, 0, stem) == 0) {
        route = r;
        longest = p.size();
      }
    }
  }
  // Requests are counted by route: "/v1/models/*", not each name asked for.
  if (route != server_.routes.end()) path_ = route->first.second;
  if (route == server_.routes.end()) {
    fail(exchange_, 404,
         "no endpoint " + request.method + " " + request.path + "; use " +
             server_.options.endpoints + ", GET /health or GET /metrics");
    return;
  }
  auto run = [handler = route->second.handler, request = std::move(request),
              reply = Reply(exchange_)]() mutable {
    try {
      handler(request, reply);
    } catch (const std::exception& e) {
      reply.fail(500, std::string("the request failed: ") + e.what());
    }
  };
  if (route->second.inline_) {
    run();
  } else {
    net::post(server_.pool, std::move(run));
  }
}
}  // namespace te::serve::http
