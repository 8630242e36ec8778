#include "keel/http/server.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/url/parse.hpp>

#include <chrono>

#include "keel/common/log.h"
#include "keel/http/router.h"
#include "keel/http/websocket.h"
#include "keel/metrics.h"

namespace keel::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr auto kIdleTimeout = std::chrono::seconds(120);

class BeastStreamWriter final : public StreamWriter {
 public:
  explicit BeastStreamWriter(beast::tcp_stream& stream) : stream_(stream) {}
  asio::awaitable<bool> Write(std::string data) override {
    boost::system::error_code ec;
    stream_.expires_after(std::chrono::seconds(30));
    co_await asio::async_write(stream_, asio::buffer(data),
                               asio::redirect_error(asio::use_awaitable, ec));
    stream_.expires_never();
    co_return !ec;
  }
  asio::awaitable<bool> Ping() override { co_return co_await Write(": keepalive\n\n"); }

 private:
  beast::tcp_stream& stream_;
};

void ParseTarget(std::string_view target, Request& out) {
  auto q = target.find('?');
  std::string_view path = target.substr(0, q);
  auto decoded_path = boost::urls::parse_origin_form(target);
  if (decoded_path) {
    out.path = std::string(decoded_path->path());
    for (auto param : decoded_path->params()) {
      out.query[std::string(param.key)] = std::string(param.value);
    }
  } else {
    out.path = std::string(path);
  }
}

}  // namespace

struct Server::Impl {
  Impl(asio::io_context& io, const Router& router, Metrics& metrics, int64_t max_body)
      : io(io), router(router), metrics(metrics), max_body(max_body), acceptor(io) {}

  asio::awaitable<void> AcceptLoop() {
    while (acceptor.is_open()) {
      boost::system::error_code ec;
      tcp::socket socket = co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (ec == asio::error::operation_aborted || !acceptor.is_open()) break;
        continue;
      }
      socket.set_option(tcp::no_delay(true), ec);
      asio::co_spawn(io, Serve(std::move(socket)), ReportExceptions{"http connection"});
    }
  }

  asio::awaitable<void> WriteSimple(beast::tcp_stream& stream, unsigned version, bool keep_alive,
                                    Response& resp, boost::system::error_code& ec) {
    bhttp::response<bhttp::string_body> res{static_cast<bhttp::status>(resp.status), version};
    res.set(bhttp::field::server, "keel");
    if (!resp.content_type.empty()) res.set(bhttp::field::content_type, resp.content_type);
    for (auto& [k, v] : resp.headers) res.set(k, v);
    res.keep_alive(keep_alive);
    res.body() = std::move(resp.body);
    res.prepare_payload();
    CountStatus(resp.status);
    co_await bhttp::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
  }

  void CountStatus(int status) {
    ++metrics.http_requests;
    if (status < 300) ++metrics.http_2xx;
    else if (status < 500) ++metrics.http_4xx;
    else ++metrics.http_5xx;
  }

  asio::awaitable<void> Serve(tcp::socket socket) {
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    boost::system::error_code ec;
    while (true) {
      bhttp::request_parser<bhttp::string_body> parser;
      parser.header_limit(64 * 1024);
      parser.body_limit(static_cast<uint64_t>(max_body));
      stream.expires_after(kIdleTimeout);
      co_await bhttp::async_read_header(stream, buffer, parser,
                                        asio::redirect_error(asio::use_awaitable, ec));
      if (ec == bhttp::error::end_of_stream || ec == asio::error::eof) break;
      Response error_resp;
      bool fatal = false;
      if (ec == bhttp::error::body_limit) {
        error_resp = Response::Error(Status(Code::kPayloadTooLarge,
                                            "request body exceeds the limit of " +
                                                std::to_string(max_body) + " bytes"));
        fatal = true;
      } else if (ec) {
        if (ec == beast::error::timeout || ec == asio::error::connection_reset ||
            ec == asio::error::operation_aborted) {
          break;
        }
        error_resp = Response::Error(InvalidArgument("malformed HTTP request: " + ec.message()));
        fatal = true;
      }
      if (!fatal) {
        auto& hdr = parser.get();
        if (beast::iequals(hdr[bhttp::field::expect], "100-continue")) {
          bhttp::response<bhttp::empty_body> cont{bhttp::status::continue_, hdr.version()};
          co_await bhttp::async_write(stream, cont, asio::redirect_error(asio::use_awaitable, ec));
          if (ec) break;
        }
        co_await bhttp::async_read(stream, buffer, parser,
                                   asio::redirect_error(asio::use_awaitable, ec));
        if (ec == bhttp::error::body_limit) {
          error_resp = Response::Error(Status(Code::kPayloadTooLarge,
                                              "request body exceeds the limit of " +
                                                  std::to_string(max_body) + " bytes"));
          fatal = true;
        } else if (ec) {
          break;
        }
      }
      if (fatal) {
        ec = {};
        co_await WriteSimple(stream, 11, false, error_resp, ec);
        break;
      }

      auto req = parser.release();
      Request r;
      r.method = std::string(req.method_string());
      ParseTarget(req.target(), r);
      for (const auto& field : req) {
        std::string name(field.name_string());
        for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        r.headers[name] = std::string(field.value());
      }
      r.body = std::move(req.body());
      stream.expires_never();
      Response resp = co_await router.Dispatch(r);

      if (resp.stream && r.IsWebSocketUpgrade()) {
        CountStatus(101);
        co_await ServeWebSocket(std::move(stream), std::move(req), std::move(resp));
        co_return;  // the WebSocket closed the connection
      }
      if (resp.stream) {
        bhttp::response<bhttp::empty_body> res{static_cast<bhttp::status>(resp.status),
                                               req.version()};
        res.set(bhttp::field::server, "keel");
        res.set(bhttp::field::content_type, resp.content_type);
        res.set(bhttp::field::cache_control, "no-cache");
        for (auto& [k, v] : resp.headers) res.set(k, v);
        res.keep_alive(false);
        bhttp::response_serializer<bhttp::empty_body> sr{res};
        CountStatus(resp.status);
        co_await bhttp::async_write_header(stream, sr, asio::redirect_error(asio::use_awaitable, ec));
        // Run the stream even when the header failed: its first write fails and it cleans up.
        BeastStreamWriter writer(stream);
        co_await resp.stream(writer);
        break;
      }
      bool keep_alive = req.keep_alive();
      co_await WriteSimple(stream, req.version(), keep_alive, resp, ec);
      if (ec || !keep_alive) break;
    }
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  asio::io_context& io;
  const Router& router;
  Metrics& metrics;
  int64_t max_body;
  tcp::acceptor acceptor;
};

Server::Server(asio::io_context& io, const Router& router, Metrics& metrics,
               int64_t max_body_bytes)
    : impl_(std::make_unique<Impl>(io, router, metrics, max_body_bytes)) {}
Server::~Server() = default;

Result<std::string> Server::Listen(const std::string& address) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos) {
    return InvalidArgument("listen address must be HOST:PORT, got '" + address + "'");
  }
  std::string host = address.substr(0, colon);
  std::string port_text = address.substr(colon + 1);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  int port = -1;
  try {
    size_t used = 0;
    port = std::stoi(port_text, &used);
    if (used != port_text.size()) port = -1;
  } catch (...) {
  }
  if (port < 0 || port > 65535) return InvalidArgument("invalid port in listen address '" + address + "'");
  boost::system::error_code ec;
  auto ip = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
  if (ec) return InvalidArgument("invalid listen host '" + host + "' (use an IP address)");
  tcp::endpoint ep(ip, static_cast<unsigned short>(port));
  auto& acc = impl_->acceptor;
  acc.open(ep.protocol(), ec);
  if (!ec) acc.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acc.bind(ep, ec);
  if (!ec) acc.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Unavailable("cannot listen on " + address + ": " + ec.message());
  auto bound = acc.local_endpoint();
  std::string h = bound.address().to_string();
  if (bound.address().is_v6()) h = "[" + h + "]";
  return h + ":" + std::to_string(bound.port());
}

void Server::Start() { asio::co_spawn(impl_->io, impl_->AcceptLoop(), ReportExceptions{"http accept loop"}); }

void Server::Stop() {
  boost::system::error_code ec;
  impl_->acceptor.close(ec);
}

}  // namespace keel::http
