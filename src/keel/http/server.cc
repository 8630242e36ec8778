#include "keel/http/server.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/url/parse.hpp>

#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

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

// A refused request's answer is written, then the rest of the request drained, within this.
constexpr auto kLingerTime = std::chrono::milliseconds(5000);
constexpr size_t kLingerBytes = 8 << 20;
// Connections over a limit: at most this many 503 answers at once, each within this time.
constexpr int kMaxRefusing = 32;
constexpr auto kRefusalTime = std::chrono::milliseconds(1000);
constexpr size_t kRefusalLingerBytes = 64 << 10;
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);
constexpr auto kWriteTimeout = std::chrono::seconds(30);

// A request's Transfer-Encoding, when Keel cannot read its body (RFC 9112 §6): only `chunked`
// is understood. A coding before it is 501, since its body would reach the handler still coded;
// a list that does not end in `chunked` (or applies it twice) is 400, since the body's length
// cannot be known; Beast would read such a request as having no body, and its body as the next
// request. Both close the connection.
std::optional<Response> RefusedTransferCoding(const bhttp::fields& header) {
  std::vector<std::string> codings;
  bool present = false;
  auto [begin, end] = header.equal_range(bhttp::field::transfer_encoding);
  for (auto field = begin; field != end; ++field) {
    present = true;
    for (auto coding : bhttp::token_list(field->value())) {
      codings.emplace_back(coding.data(), coding.size());
    }
  }
  if (!present) return std::nullopt;
  auto chunked = [](const std::string& c) { return beast::iequals(c, "chunked"); };
  if (codings.empty() || !chunked(codings.back()) ||
      std::count_if(codings.begin(), codings.end(), chunked) > 1) {
    return Response::Error(InvalidArgument(
        "malformed HTTP request: Transfer-Encoding must be chunked, once and last"));
  }
  if (codings.size() > 1) {
    Response r = Response::Error(InvalidArgument(
        "transfer coding '" + codings.front() +
        "' is not implemented; send the body with Transfer-Encoding: chunked or Content-Length"));
    r.status = 501;
    return r;
  }
  return std::nullopt;
}

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

// The path and query of a request target. A target that does not parse (a bad percent-escape
// was read as no query at all, so `limit=%zz` gave the default page) and a path segment that
// decodes to a slash (`/v1/agents/ID%2fsessions` was routed as `/v1/agents/ID/sessions`, which
// a proxy's path rules in front would not have seen) are refused.
Status ParseTarget(std::string_view target, Request& out) {
  auto parsed = boost::urls::parse_origin_form(target);
  if (!parsed) return InvalidArgument("malformed request target");
  for (auto segment : parsed->segments()) {
    if (segment.find('/') != std::string::npos) {
      return InvalidArgument("a path segment may not hold an encoded slash (%2F)");
    }
  }
  out.path = std::string(parsed->path());
  for (auto param : parsed->params()) {
    out.query[std::string(param.key)] = std::string(param.value);
  }
  return Status::Ok();
}

}  // namespace

struct Server::Impl {
  Impl(asio::io_context& io, const Router& router, Metrics& metrics, ServerOptions options)
      : io(io), router(router), metrics(metrics), options(options), acceptor(io) {}

  // An open connection's place in the limits, held by its coroutine until it ends.
  class Slot {
   public:
    Slot(Impl& impl, int fd, std::string address)
        : impl_(&impl), fd_(fd), address_(std::move(address)) {
      impl_->open_fds.insert(fd_);
      ++impl_->per_address[address_];
    }
    Slot(Slot&& other) noexcept
        : impl_(std::exchange(other.impl_, nullptr)), fd_(other.fd_),
          address_(std::move(other.address_)) {}
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    Slot& operator=(Slot&&) = delete;
    ~Slot() {
      if (!impl_) return;
      impl_->open_fds.erase(fd_);
      auto it = impl_->per_address.find(address_);
      if (it != impl_->per_address.end() && --it->second == 0) impl_->per_address.erase(it);
    }

   private:
    Impl* impl_;
    int fd_;
    std::string address_;
  };

  asio::awaitable<void> AcceptLoop() {
    asio::steady_timer backoff(io);
    bool failing = false;  // accepting fails (e.g. out of descriptors); logged once
    while (acceptor.is_open()) {
      boost::system::error_code ec;
      tcp::socket socket = co_await acceptor.async_accept(asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {
        if (ec == asio::error::operation_aborted || !acceptor.is_open()) break;
        if (ec == asio::error::connection_aborted) continue;  // that client gave up
        // Out of descriptors (EMFILE, ENFILE) or memory: the pending connection stays queued
        // and the acceptor stays readable, so retrying at once would spin. Wait for
        // connections to close.
        if (!failing) {
          LogError("http: cannot accept connections (" + ec.message() +
                   "); retrying every 100 ms");
          failing = true;
        }
        backoff.expires_after(kAcceptBackoff);
        co_await backoff.async_wait(asio::redirect_error(asio::use_awaitable, ec));
        continue;
      }
      if (failing) {
        LogInfo("http: accepting connections again");
        failing = false;
      }
      Admit(std::move(socket));
    }
  }

  // Serves the connection, or answers 503 and closes it when it is over a limit.
  void Admit(tcp::socket socket) {
    boost::system::error_code ec;
    auto remote = socket.remote_endpoint(ec);
    if (ec) return;  // already gone
    auto ip = remote.address();
    if (ip.is_v6() && ip.to_v6().is_v4_mapped()) {
      ip = asio::ip::make_address_v4(asio::ip::v4_mapped, ip.to_v6());
    }
    std::string address = ip.to_string();
    std::string refusal;
    if (static_cast<int64_t>(open_fds.size()) >= options.max_connections) {
      refusal = "the server has its maximum of " + std::to_string(options.max_connections) +
                " open connections; retry later";
    } else if (auto it = per_address.find(address);
               it != per_address.end() && it->second >= options.max_connections_per_address) {
      refusal = "this address has its maximum of " +
                std::to_string(options.max_connections_per_address) +
                " open connections; close some or retry later";
    }
    if (!refusal.empty()) {
      // Answering costs a descriptor for a moment: only a few at once, the rest are closed.
      if (refusing >= kMaxRefusing) return;
      ++refusing;  // here, not in Refuse: co_spawn starts it later
      asio::co_spawn(io, Refuse(std::move(socket), std::move(refusal)),
                     ReportExceptions{"http refusal"});
      return;
    }
    socket.set_option(tcp::no_delay(true), ec);
    Slot slot(*this, socket.native_handle(), std::move(address));
    asio::co_spawn(io, Serve(std::move(socket), std::move(slot)),
                   ReportExceptions{"http connection"});
  }

  asio::awaitable<void> Refuse(tcp::socket socket, std::string message) {
    beast::tcp_stream stream(std::move(socket));
    Response resp = Response::Error(Unavailable(message));
    resp.headers["Retry-After"] = "1";
    boost::system::error_code ec;
    stream.expires_after(kRefusalTime);
    co_await WriteSimple(stream, 11, false, resp, ec);
    beast::flat_buffer buffer;
    if (!ec) co_await LingeringClose(stream, buffer, kRefusalTime, kRefusalLingerBytes);
    --refusing;
  }

  // After answering a request that is refused before its body was read: stops sending, then
  // reads and drops what the client still sends (up to `max_bytes`, for at most `max_time`).
  // Closing with unread data would reset the connection, and a client still sending its body
  // would see a broken pipe instead of the answer.
  static asio::awaitable<void> LingeringClose(beast::tcp_stream& stream,
                                              beast::flat_buffer& buffer,
                                              std::chrono::milliseconds max_time,
                                              size_t max_bytes) {
    boost::system::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream.expires_after(max_time);
    size_t read = buffer.size();
    buffer.clear();
    while (!ec && read < max_bytes) {
      size_t n = co_await stream.async_read_some(buffer.prepare(64 * 1024),
                                                 asio::redirect_error(asio::use_awaitable, ec));
      read += n;
      buffer.clear();
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

  Response TooLarge() const {
    return Response::Error(Status(Code::kPayloadTooLarge,
                                  "request body exceeds the limit of " +
                                      std::to_string(options.max_body_bytes) + " bytes"));
  }

  // `slot` is held until the connection ends.
  asio::awaitable<void> Serve(tcp::socket socket, [[maybe_unused]] Slot slot) {
    beast::tcp_stream stream(std::move(socket));
    beast::flat_buffer buffer;
    boost::system::error_code ec;
    for (bool first = true;; first = false) {
      bhttp::request_parser<bhttp::string_body> parser;
      parser.header_limit(64 * 1024);
      parser.body_limit(static_cast<uint64_t>(options.max_body_bytes));
      if (!first && buffer.size() == 0) {
        // Kept alive between requests: wait (bounded) for the next request's first byte.
        stream.expires_after(options.idle_timeout);
        size_t n = co_await stream.async_read_some(buffer.prepare(16 * 1024),
                                                   asio::redirect_error(asio::use_awaitable, ec));
        if (ec) break;
        buffer.commit(n);
      }
      stream.expires_after(options.header_timeout);
      co_await bhttp::async_read_header(stream, buffer, parser,
                                        asio::redirect_error(asio::use_awaitable, ec));
      if (ec == bhttp::error::end_of_stream || ec == asio::error::eof) break;
      Response error_resp;
      bool fatal = false;
      if (ec == bhttp::error::body_limit) {
        error_resp = TooLarge();
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
        if (auto refused = RefusedTransferCoding(parser.get())) {
          error_resp = std::move(*refused);
          fatal = true;
        }
      }
      if (!fatal) {
        stream.expires_after(options.body_timeout);
        auto& hdr = parser.get();
        if (beast::iequals(hdr[bhttp::field::expect], "100-continue")) {
          bhttp::response<bhttp::empty_body> cont{bhttp::status::continue_, hdr.version()};
          co_await bhttp::async_write(stream, cont, asio::redirect_error(asio::use_awaitable, ec));
          if (ec) break;
        }
        co_await bhttp::async_read(stream, buffer, parser,
                                   asio::redirect_error(asio::use_awaitable, ec));
        if (ec == bhttp::error::body_limit) {
          error_resp = TooLarge();
          fatal = true;
        } else if (ec.category() == bhttp::make_error_code(bhttp::error::bad_chunk).category() &&
                   ec != bhttp::error::partial_message) {
          // The body is malformed (a chunk size of "zz"): answered, not dropped in silence. A
          // partial message is a client that went away.
          error_resp = Response::Error(InvalidArgument("malformed HTTP request: " + ec.message()));
          fatal = true;
        } else if (ec) {
          break;
        }
      }
      if (fatal) {
        ec = {};
        stream.expires_after(kLingerTime);
        co_await WriteSimple(stream, 11, false, error_resp, ec);
        if (!ec) co_await LingeringClose(stream, buffer, kLingerTime, kLingerBytes);
        co_return;
      }

      auto req = parser.release();
      Request r;
      r.method = std::string(req.method_string());
      Status well_formed = ParseTarget(req.target(), r);
      for (const auto& field : req) {
        std::string name(field.name_string());
        for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        // Two credentials are one too many: a proxy may have checked the other one.
        if (name == "authorization" && r.headers.count(name) && well_formed.ok()) {
          well_formed = InvalidArgument("more than one Authorization header");
        }
        r.headers[name] = std::string(field.value());
      }
      r.body = std::move(req.body());
      stream.expires_never();
      Response resp;
      if (!well_formed.ok()) {
        resp = Response::Error(well_formed);
      } else if (auto preflight = Preflight(options.cors, r)) {
        resp = std::move(*preflight);
      } else {
        resp = co_await router.Dispatch(r);
      }
      AllowCrossOrigin(options.cors, r, resp);

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
      bool keep_alive = req.keep_alive() && !stopping;
      stream.expires_after(kWriteTimeout);
      co_await WriteSimple(stream, req.version(), keep_alive, resp, ec);
      if (ec || !keep_alive) break;
    }
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  }

  void Stop() {
    stopping = true;
    boost::system::error_code ec;
    acceptor.close(ec);
    // No more requests: a connection waiting for one reads end-of-file and closes; one with a
    // request in flight still writes its answer.
    for (int fd : open_fds) ::shutdown(fd, SHUT_RD);
  }

  asio::io_context& io;
  const Router& router;
  Metrics& metrics;
  const ServerOptions options;
  tcp::acceptor acceptor;
  std::unordered_set<int> open_fds;                    // descriptors of connections served
  std::unordered_map<std::string, int> per_address;    // open connections by client address
  int refusing = 0;                                    // 503 answers being written
  bool stopping = false;
};

Server::Server(asio::io_context& io, const Router& router, Metrics& metrics,
               ServerOptions options)
    : impl_(std::make_unique<Impl>(io, router, metrics, options)) {}
Server::~Server() = default;

namespace {

Result<tcp::endpoint> EndpointOf(const std::string& address) {
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
  return tcp::endpoint(ip, static_cast<unsigned short>(port));
}

Status Bind(tcp::acceptor& acc, const tcp::endpoint& ep, const std::string& address) {
  boost::system::error_code ec;
  acc.open(ep.protocol(), ec);
  if (!ec) acc.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acc.bind(ep, ec);
  if (!ec) acc.listen(asio::socket_base::max_listen_connections, ec);
  if (ec == asio::error::address_in_use) {
    return Unavailable("cannot listen on " + address + ": " + ec.message() +
                       " (another server, such as a `keel serve` or `make run` already running, "
                       "listens there: stop it, or choose another port with --listen)");
  }
  if (ec) return Unavailable("cannot listen on " + address + ": " + ec.message());
  return Status::Ok();
}

}  // namespace

Status CheckCanListen(const std::string& address) {
  KEEL_ASSIGN_OR_RETURN(tcp::endpoint ep, EndpointOf(address));
  if (ep.port() == 0) return Status::Ok();
  asio::io_context io;
  tcp::acceptor probe(io);
  return Bind(probe, ep, address);  // closed when it goes out of scope
}

Result<std::string> Server::Listen(const std::string& address) {
  KEEL_ASSIGN_OR_RETURN(tcp::endpoint ep, EndpointOf(address));
  auto& acc = impl_->acceptor;
  KEEL_RETURN_IF_ERROR(Bind(acc, ep, address));
  auto bound = acc.local_endpoint();
  std::string h = bound.address().to_string();
  if (bound.address().is_v6()) h = "[" + h + "]";
  return h + ":" + std::to_string(bound.port());
}

void Server::Start() { asio::co_spawn(impl_->io, impl_->AcceptLoop(), ReportExceptions{"http accept loop"}); }

void Server::Stop() { impl_->Stop(); }

}  // namespace keel::http
