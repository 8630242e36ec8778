#include "keel/http/client.h"

#include <openssl/ssl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <boost/asio/execution/context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/url/parse.hpp>
#include <cctype>
#include <charconv>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace keel::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
namespace ssl = boost::asio::ssl;
using tcp = asio::ip::tcp;
using boost::system::error_code;

constexpr uint32_t kHeaderLimit = 64 * 1024;
constexpr size_t kReadChunk = 16 * 1024;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Where a URL points, in the pieces a connection needs.
struct Endpoint {
  bool tls = false;
  std::string host;         // for DNS and SNI: no brackets around IPv6 literals
  std::string host_header;  // the Host header: brackets and a non-default port kept
  std::string port;
  std::string target;  // path and query
};

Result<Endpoint> ParseUrl(const std::string& url) {
  auto parsed = boost::urls::parse_uri(url);
  if (!parsed) return InvalidArgument("malformed URL '" + url + "': " + parsed.error().message());
  boost::urls::url_view u = *parsed;
  Endpoint e;
  std::string scheme = Lower(u.scheme());
  if (scheme == "https") {
    e.tls = true;
  } else if (scheme != "http") {
    return InvalidArgument("URL '" + url + "' must start with http:// or https://");
  }
  e.host = u.host_address();
  if (!u.has_authority() || e.host.empty()) {
    return InvalidArgument("URL '" + url + "' names no host");
  }
  e.host_header = std::string(u.encoded_host());
  if (u.has_port() && !u.port().empty()) {
    e.port = std::string(u.port());
    e.host_header += ":" + e.port;
  } else {
    e.port = e.tls ? "443" : "80";
  }
  e.target = std::string(u.encoded_path());
  if (e.target.empty()) e.target = "/";
  if (u.has_query()) e.target += "?" + std::string(u.encoded_query());
  return e;
}

bool HasLineBreak(std::string_view s) { return s.find_first_of("\r\n") != std::string_view::npos; }

// How many idle connections a client keeps, and for how long.
constexpr size_t kMaxIdleConnections = 32;
constexpr auto kMaxIdleTime = std::chrono::seconds(30);

// A connection whose last response was read to its end and may carry another request.
struct IdleConnection {
  std::string key;  // the client's number and the origin, "7 https://host:port"
  std::shared_ptr<ssl::context> tls_context;
  std::unique_ptr<beast::tcp_stream> plain;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> tls;
  std::chrono::steady_clock::time_point since;
};

// The idle keep-alive connections of an io_context, kept as one of its services: they are
// sockets of that context, so they go when it shuts down, and a connection is only ever used
// again on the context it belongs to. Keyed by client (each has its own outbound guard and TLS
// settings) and origin.
class ConnectionPool : public asio::execution_context::service {
 public:
  static inline asio::execution_context::id id;
  explicit ConnectionPool(asio::execution_context& context) : service(context) {}

  std::optional<IdleConnection> Take(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(idle_, [&](const IdleConnection& c) { return now - c.since > kMaxIdleTime; });
    for (auto it = idle_.rbegin(); it != idle_.rend(); ++it) {  // the most recent first
      if (it->key == key) {
        IdleConnection c = std::move(*it);
        idle_.erase(std::next(it).base());
        return c;
      }
    }
    return std::nullopt;
  }
  void Put(IdleConnection c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.size() >= kMaxIdleConnections) idle_.pop_front();  // closes the oldest
    c.since = std::chrono::steady_clock::now();
    idle_.push_back(std::move(c));
  }

 private:
  void shutdown() override {
    std::lock_guard<std::mutex> lock(mu_);
    idle_.clear();
  }
  std::mutex mu_;
  std::deque<IdleConnection> idle_;
};

// Numbers clients, for the pool's keys (an address may be reused by a later client).
std::atomic<uint64_t> next_client{1};

}  // namespace

std::string ClientResponse::Header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? "" : it->second;
}

namespace {

// A TLS client context and why there is none; built on the first https request (loading the
// system's trust store costs tens of milliseconds, and most servers never call out over TLS)
// and shared by every Client with the same trust settings.
struct TlsSetup {
  std::shared_ptr<ssl::context> context;
  std::string error;  // why `context` is null
};

TlsSetup BuildTls(bool verify_peer, const std::string& ca_file) {
  TlsSetup out;
  try {
    auto ctx = std::make_shared<ssl::context>(ssl::context::tls_client);
    SSL_CTX_set_min_proto_version(ctx->native_handle(), TLS1_2_VERSION);
    error_code ec;
    ctx->set_default_verify_paths(ec);
    if (ec) out.error = "system trust store: " + ec.message();
    if (!ca_file.empty()) {
      ctx->load_verify_file(ca_file, ec);
      if (ec) {
        out.error = "CA file '" + ca_file + "': " + ec.message();
        return out;  // a configured trust anchor that cannot be loaded disables TLS, loudly
      }
    }
    ctx->set_verify_mode(verify_peer ? ssl::verify_peer : ssl::verify_none, ec);
    if (ec) {
      out.error = "verify mode: " + ec.message();
      return out;
    }
    out.context = std::move(ctx);
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

// The setup for these trust settings, built once per process. Not cached when it failed, so
// that a CA file put in place later is read then.
TlsSetup SharedTls(bool verify_peer, const std::string& ca_file) {
  static std::mutex mu;
  static std::map<std::pair<bool, std::string>, std::shared_ptr<ssl::context>> built;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(verify_peer, ca_file);
  if (auto it = built.find(key); it != built.end()) return TlsSetup{it->second, ""};
  TlsSetup setup = BuildTls(verify_peer, ca_file);
  if (setup.context) built.emplace(std::move(key), setup.context);
  return setup;
}

}  // namespace

struct Client::Impl {
  Options options;
  uint64_t number = next_client++;  // keys its idle connections in each context's pool
};

// One connection, from connecting to the end of the response body.
struct ResponseStream::Impl {
  Impl(asio::any_io_executor executor, std::chrono::milliseconds wait_limit,
       std::chrono::milliseconds total)
      : ex(std::move(executor)),
        timeout(wait_limit),
        end(total.count() > 0 ? std::chrono::steady_clock::now() + total
                              : std::chrono::steady_clock::time_point::max()) {}

  // The next wait's bound: the timeout, or what is left of the request's total.
  std::chrono::milliseconds Wait() const {
    if (end == std::chrono::steady_clock::time_point::max()) return timeout;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        end - std::chrono::steady_clock::now());
    return std::max(std::chrono::milliseconds(0), std::min(timeout, left));
  }

  ~Impl() {
    if (!tls && !plain) return;
    // A response read to its end on a connection both sides keep alive carries the next
    // request to the same origin (no new connection, no new TLS handshake).
    if (pool && parser && parser->is_done() && parser->get().keep_alive() && pending_error.ok() &&
        buffer.size() == 0) {
      pool->Put(IdleConnection{pool_key, tls_context, std::move(plain), std::move(tls), {}});
      return;
    }
    Close();
  }

  void Close() {
    if (!tls && !plain) return;
    error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    Lowest().socket().close(ignored);
    tls.reset();
    plain.reset();
  }

  beast::tcp_stream& Lowest() { return tls ? beast::get_lowest_layer(*tls) : *plain; }

  std::string Describe(const error_code& ec) const {
    if (ec == beast::error::timeout) {
      return "no answer within " + std::to_string(timeout.count()) + " ms";
    }
    return ec.message();
  }

  Status Fail(std::string_view stage, const error_code& ec) const {
    return Unavailable(what + ": " + std::string(stage) + ": " + Describe(ec));
  }

  // Sends the request on an idle connection to its origin when the pool has one, else on a new
  // one, and reads the response head. A reused connection the server closed meanwhile (no
  // byte of an answer came) is dropped and the request sent once more on a new connection.
  asio::awaitable<Status> Start(const ClientRequest& request, const Endpoint& endpoint,
                                const std::shared_ptr<ssl::context>& tls_ctx,
                                const std::string& tls_error, const Client::Options& options,
                                uint64_t client) {
    what = request.method + " " + request.url;
    pool_key = std::to_string(client) + " " + (endpoint.tls ? "https://" : "http://") +
               endpoint.host + ":" + endpoint.port;
    pool = &asio::use_service<ConnectionPool>(asio::query(ex, asio::execution::context));
    if (auto idle = request.may_repeat ? pool->Take(pool_key) : std::nullopt) {
      tls_context = std::move(idle->tls_context);
      plain = std::move(idle->plain);
      tls = std::move(idle->tls);
      bool answered = false;
      Status sent = co_await Exchange(request, endpoint, options, &answered);
      if (sent.ok() || answered) co_return sent;
      Close();
      buffer.clear();
    }
    Status connected = co_await Connect(endpoint, tls_ctx, tls_error, options);
    if (!connected.ok()) co_return connected;
    co_return co_await Exchange(request, endpoint, options, nullptr);
  }

  // Resolves, checks the addresses with the outbound guard, connects, and shakes hands (TLS).
  asio::awaitable<Status> Connect(const Endpoint& endpoint,
                                  const std::shared_ptr<ssl::context>& tls_ctx,
                                  const std::string& tls_error, const Client::Options& options) {
    error_code ec;

    // An address literal needs no resolver (whose lookups run on a thread of their own); a
    // name is resolved, with a deadline.
    std::vector<tcp::endpoint> candidates;
    error_code not_literal;
    const asio::ip::address literal = asio::ip::make_address(endpoint.host, not_literal);
    unsigned port = 0;
    const auto [end, parsed] =
        std::from_chars(endpoint.port.data(), endpoint.port.data() + endpoint.port.size(), port);
    if (!not_literal && parsed == std::errc() &&
        end == endpoint.port.data() + endpoint.port.size() && port <= 65535) {
      candidates.emplace_back(literal, static_cast<unsigned short>(port));
    } else {
      // The resolver has no deadline of its own; a timer cancels it. The timer's handler holds
      // only a weak reference, since it may run after this frame is gone.
      auto resolver = std::make_shared<tcp::resolver>(ex);
      asio::steady_timer deadline(ex);
      deadline.expires_after(Wait());
      deadline.async_wait([weak = std::weak_ptr<tcp::resolver>(resolver)](error_code wait_ec) {
        if (wait_ec) return;
        if (auto r = weak.lock()) r->cancel();
      });
      auto results = co_await resolver->async_resolve(
          endpoint.host, endpoint.port, asio::redirect_error(asio::use_awaitable, ec));
      deadline.cancel();
      if (ec == asio::error::operation_aborted) {
        co_return Unavailable(what + ": resolving '" + endpoint.host + "': no answer within " +
                              std::to_string(timeout.count()) + " ms");
      }
      if (ec) co_return Fail("resolving '" + endpoint.host + "'", ec);
      for (const auto& entry : results) candidates.push_back(entry.endpoint());
    }
    // The guard judges the addresses actually connected to, so neither a name that resolves to
    // an internal address nor one that re-resolves differently (DNS rebinding) gets past it.
    std::vector<tcp::endpoint> allowed;
    Status refused;
    for (const tcp::endpoint& ep : candidates) {
      Status ok = options.outbound ? options.outbound->Check(ep.address()) : Status::Ok();
      if (ok.ok()) {
        allowed.push_back(ep);
      } else if (refused.ok()) {
        refused = ok;
      }
    }
    if (allowed.empty()) {
      if (!refused.ok()) {
        co_return PermissionDenied(what + ": refused: " + refused.message());
      }
      co_return Unavailable(what + ": resolving '" + endpoint.host + "': no address");
    }

    if (endpoint.tls) {
      if (!tls_ctx) co_return Internal(what + ": TLS is unavailable: " + tls_error);
      tls = std::make_unique<beast::ssl_stream<beast::tcp_stream>>(ex, *tls_ctx);
      tls_context = tls_ctx;
      // SNI: servers behind shared front ends pick their certificate by it. It carries names
      // only, never address literals (RFC 6066).
      error_code not_ip;
      asio::ip::make_address(endpoint.host, not_ip);
      if (not_ip && !SSL_set_tlsext_host_name(tls->native_handle(), endpoint.host.c_str())) {
        co_return Internal(what + ": cannot set the TLS server name");
      }
      if (options.verify_peer) {
        tls->set_verify_callback(ssl::host_name_verification(endpoint.host), ec);
        if (ec) co_return Fail("TLS setup", ec);
      }
    } else {
      plain = std::make_unique<beast::tcp_stream>(ex);
    }

    Lowest().expires_after(Wait());
    co_await Lowest().async_connect(allowed, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) co_return Fail("connecting to " + endpoint.host_header, ec);

    if (tls) {
      Lowest().expires_after(Wait());
      co_await tls->async_handshake(ssl::stream_base::client,
                                    asio::redirect_error(asio::use_awaitable, ec));
      if (ec) co_return Fail("TLS handshake with " + endpoint.host, ec);
    }
    co_return Status::Ok();
  }

  // Sends the request and reads the response head. `answered` (when given) says whether any
  // byte of an answer arrived.
  asio::awaitable<Status> Exchange(const ClientRequest& request, const Endpoint& endpoint,
                                   const Client::Options& options, bool* answered) {
    error_code ec;
    bhttp::request<bhttp::string_body> req;
    req.version(11);
    bhttp::verb verb = bhttp::string_to_verb(request.method);
    if (verb == bhttp::verb::unknown) {
      req.method_string(request.method);
    } else {
      req.method(verb);
    }
    req.target(endpoint.target);
    req.set(bhttp::field::host, endpoint.host_header);
    req.set(bhttp::field::user_agent, options.user_agent);
    for (const auto& [name, value] : request.headers) req.insert(name, value);
    req.body() = request.body;
    if (!request.body.empty() || verb == bhttp::verb::post || verb == bhttp::verb::put ||
        verb == bhttp::verb::patch) {
      req.prepare_payload();
    }

    Lowest().expires_after(Wait());
    if (tls) {
      co_await bhttp::async_write(*tls, req, asio::redirect_error(asio::use_awaitable, ec));
    } else {
      co_await bhttp::async_write(*plain, req, asio::redirect_error(asio::use_awaitable, ec));
    }
    if (ec) co_return Fail("sending the request", ec);

    parser.emplace();
    parser->header_limit(kHeaderLimit);
    parser->body_limit(boost::none);  // callers bound what they keep (ReadAll)
    if (verb == bhttp::verb::head) parser->skip(true);
    Lowest().expires_after(Wait());
    if (tls) {
      co_await bhttp::async_read_header(*tls, buffer, *parser,
                                        asio::redirect_error(asio::use_awaitable, ec));
    } else {
      co_await bhttp::async_read_header(*plain, buffer, *parser,
                                        asio::redirect_error(asio::use_awaitable, ec));
    }
    if (answered) *answered = parser->got_some() || buffer.size() > 0;
    if (ec) co_return Fail("reading the response head", ec);

    status = parser->get().result_int();
    for (const auto& field : parser->get()) {
      std::string name = Lower(field.name_string());
      std::string value(field.value());
      auto [it, inserted] = headers.emplace(name, value);
      if (!inserted) it->second += ", " + value;
    }
    co_return Status::Ok();
  }

  asio::awaitable<Result<std::optional<std::string>>> Next() {
    using Piece = std::optional<std::string>;
    if (!pending_error.ok()) co_return pending_error;
    while (!parser->is_done()) {
      parser->get().body().data = read_buffer.data();
      parser->get().body().size = read_buffer.size();
      error_code ec;
      Lowest().expires_after(Wait());
      if (tls) {
        co_await bhttp::async_read_some(*tls, buffer, *parser,
                                        asio::redirect_error(asio::use_awaitable, ec));
      } else {
        co_await bhttp::async_read_some(*plain, buffer, *parser,
                                        asio::redirect_error(asio::use_awaitable, ec));
      }
      if (ec == bhttp::error::need_buffer) ec = {};
      size_t n = read_buffer.size() - parser->get().body().size;
      if (ec) {
        pending_error = Fail("reading the response body after " +
                                 std::to_string(body_bytes + static_cast<int64_t>(n)) + " bytes",
                             ec);
        // The bytes that did arrive are delivered first; the failure comes with the next call.
        if (n == 0) co_return pending_error;
      }
      if (n > 0) {
        body_bytes += static_cast<int64_t>(n);
        co_return Piece(std::string(read_buffer.data(), n));
      }
    }
    co_return Piece();
  }

  asio::any_io_executor ex;
  std::chrono::milliseconds timeout;
  std::chrono::steady_clock::time_point end;  // of the whole request (max: none)
  std::string what;  // "POST https://host/path", to name the request in errors
  std::shared_ptr<ssl::context> tls_context;  // kept alive for `tls`
  // Exactly one of these is set once connecting has begun.
  std::unique_ptr<beast::tcp_stream> plain;
  std::unique_ptr<beast::ssl_stream<beast::tcp_stream>> tls;
  beast::flat_buffer buffer;
  std::optional<bhttp::response_parser<bhttp::buffer_body>> parser;  // one per request sent
  std::string pool_key;            // the client's number and the origin
  ConnectionPool* pool = nullptr;  // the context's, where the connection goes when it is done
  std::array<char, kReadChunk> read_buffer{};
  int status = 0;
  std::map<std::string, std::string> headers;
  int64_t body_bytes = 0;
  Status pending_error;
};

ResponseStream::ResponseStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ResponseStream::~ResponseStream() = default;

int ResponseStream::status() const { return impl_->status; }
const std::map<std::string, std::string>& ResponseStream::headers() const { return impl_->headers; }
std::string ResponseStream::Header(const std::string& lower_name) const {
  auto it = impl_->headers.find(lower_name);
  return it == impl_->headers.end() ? "" : it->second;
}
int64_t ResponseStream::body_bytes() const { return impl_->body_bytes; }

boost::asio::awaitable<Result<std::optional<std::string>>> ResponseStream::Next() {
  try {
    co_return co_await impl_->Next();
  } catch (const std::exception& e) {
    co_return Internal(impl_->what + ": reading the response body: " + e.what());
  }
}

boost::asio::awaitable<Result<std::string>> ResponseStream::ReadAll(size_t max_bytes) {
  std::string body;
  while (true) {
    auto piece = co_await Next();
    if (!piece.ok()) co_return piece.status();
    if (!piece->has_value()) break;
    if (body.size() + (*piece)->size() > max_bytes) {
      co_return Unavailable(impl_->what + ": response body exceeds " + std::to_string(max_bytes) +
                            " bytes");
    }
    body += **piece;
  }
  co_return body;
}

Client::Client() : Client(Options{}) {}

Client::Client(Options options) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
}

Client::~Client() = default;

boost::asio::awaitable<Result<std::unique_ptr<ResponseStream>>> Client::Open(
    const ClientRequest& request) {
  auto endpoint = ParseUrl(request.url);
  if (!endpoint.ok()) co_return endpoint.status();
  for (const auto& [name, value] : request.headers) {
    if (name.empty() || HasLineBreak(name) || HasLineBreak(value)) {
      co_return InvalidArgument("request header '" + name + "' has an invalid name or value");
    }
  }
  if (request.method.empty() || HasLineBreak(request.method)) {
    co_return InvalidArgument("invalid request method '" + request.method + "'");
  }
  auto executor = co_await boost::asio::this_coro::executor;
  auto impl = std::make_unique<ResponseStream::Impl>(executor, request.timeout, request.total);
  Status started;
  try {
    // Shared with the stream: it may outlive this Client.
    TlsSetup tls;
    if (endpoint->tls) tls = SharedTls(impl_->options.verify_peer, impl_->options.ca_file);
    started = co_await impl->Start(request, *endpoint, tls.context, tls.error, impl_->options,
                                   impl_->number);
  } catch (const std::exception& e) {
    started = Internal(request.method + " " + request.url + ": " + e.what());
  }
  if (!started.ok()) co_return started;
  co_return std::unique_ptr<ResponseStream>(new ResponseStream(std::move(impl)));
}

boost::asio::awaitable<Result<ClientResponse>> Client::Fetch(const ClientRequest& request,
                                                             size_t max_body_bytes) {
  auto stream = co_await Open(request);
  if (!stream.ok()) co_return stream.status();
  ClientResponse response;
  response.status = (*stream)->status();
  response.headers = (*stream)->headers();
  auto body = co_await (*stream)->ReadAll(max_body_bytes);
  if (!body.ok()) co_return body.status();
  response.body = std::move(body).value();
  co_return response;
}

}  // namespace keel::http
