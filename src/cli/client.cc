#include "cli/client.h"

#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstdint>

namespace keel::cli {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr std::chrono::seconds kConnectTimeout(30);
constexpr std::uint64_t kMaxResponseBody = 64 * 1024 * 1024;

// Runs one asynchronous operation to completion on `ioc`. The CLI is synchronous, but only the
// asynchronous operations of beast::tcp_stream honour its timeouts, so every step goes through
// here: start the operation, run the context until it completes, return its error code.
template <typename Initiate>
beast::error_code RunOp(net::io_context& ioc, Initiate&& initiate) {
  beast::error_code result;
  std::forward<Initiate>(initiate)([&result](beast::error_code ec, auto&&...) { result = ec; });
  ioc.restart();
  ioc.run();
  return result;
}

Status TransportError(std::string_view what, const std::string& url, beast::error_code ec) {
  std::string reason = ec == beast::error::timeout ? "timed out" : ec.message();
  return Unavailable(std::string(what) + " " + url + ": " + reason);
}

std::string HostHeader(const std::string& host, const std::string& port) {
  bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + port;
}

// Resolves and connects `stream`, with its expiry already set by the caller.
Status Connect(net::io_context& ioc, beast::tcp_stream& stream, const std::string& host,
               const std::string& port, const std::string& url) {
  tcp::resolver resolver(ioc);
  beast::error_code ec;
  auto endpoints = resolver.resolve(host, port, ec);
  if (ec) return TransportError("cannot resolve", url, ec);
  ec = RunOp(ioc, [&](auto handler) { stream.async_connect(endpoints, std::move(handler)); });
  if (ec) return TransportError("cannot connect to", url, ec);
  return Status::Ok();
}

template <typename Body>
void SetCommonHeaders(http::request<Body>& req, const std::string& host, const std::string& port,
                      const std::string& token, const Headers& extra) {
  req.set(http::field::host, HostHeader(host, port));
  req.set(http::field::user_agent, "keel-cli");
  if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
  for (const auto& [name, value] : extra) req.set(name, value);
}

}  // namespace

// The connection and incremental parser behind an SseStream. The parser reads the body into
// `chunk` through a buffer_body, so events surface as soon as their bytes arrive, whether the
// body is chunked or delimited by the connection closing.
struct SseStream::Impl {
  net::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  std::array<char, 8192> chunk{};
  std::string url;

  std::string pending;  // body bytes not yet split into lines
  SseEvent current;     // the event being assembled from its field lines
  bool has_fields = false;
  bool has_data = false;
  bool ended = false;

  // Consumes complete lines from `pending`; returns an event when a blank line completes one.
  std::optional<SseEvent> TakeEvent() {
    std::size_t start = 0;
    std::optional<SseEvent> out;
    while (!out) {
      std::size_t end = pending.find('\n', start);
      if (end == std::string::npos) break;
      std::string_view line(pending.data() + start, end - start);
      start = end + 1;
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) {
        if (has_fields) out = std::exchange(current, SseEvent{});
        has_fields = has_data = false;
        continue;
      }
      if (line.front() == ':') continue;  // a comment, e.g. ": keepalive"
      std::size_t colon = line.find(':');
      std::string_view field = line.substr(0, colon);
      std::string_view value = colon == std::string_view::npos ? "" : line.substr(colon + 1);
      if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
      if (field == "data") {
        if (has_data) current.data += '\n';
        current.data += value;
        has_data = true;
        has_fields = true;
      } else if (field == "event") {
        current.event = value;
        has_fields = true;
      } else if (field == "id") {
        current.id = value;
        has_fields = true;
      }
    }
    pending.erase(0, start);
    return out;
  }

  // Reads whatever body bytes arrive next into `pending`; sets `ended` at the end of the body.
  Status ReadSome() {
    if (parser.is_done()) {
      ended = true;
      return Status::Ok();
    }
    parser.get().body().data = chunk.data();
    parser.get().body().size = chunk.size();
    beast::error_code ec = RunOp(ioc, [&](auto handler) {
      http::async_read_some(stream, buffer, parser, std::move(handler));
    });
    pending.append(chunk.data(), chunk.size() - parser.get().body().size);
    if (ec == http::error::need_buffer) ec = {};
    if (ec == http::error::end_of_stream || ec == net::error::eof) {
      ended = true;
      return Status::Ok();
    }
    if (ec) return TransportError("lost the stream from", url, ec);
    if (parser.is_done()) ended = true;
    return Status::Ok();
  }
};

SseStream::SseStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SseStream::~SseStream() = default;

Result<std::optional<SseEvent>> SseStream::Next() {
  while (true) {
    if (auto event = impl_->TakeEvent()) return std::optional<SseEvent>(std::move(*event));
    if (impl_->ended) return std::optional<SseEvent>();
    KEEL_RETURN_IF_ERROR(impl_->ReadSome());
  }
}

void SseStream::SetDeadline(std::chrono::steady_clock::time_point deadline) {
  impl_->stream.expires_at(deadline);
}

Result<HttpClient> HttpClient::Create(std::string_view url, std::string token) {
  std::string_view rest = url;
  if (rest.starts_with("https://")) {
    return InvalidArgument("the keel CLI speaks plain http only (got " + std::string(url) +
                           "); the server binds loopback, so use http://HOST:PORT");
  }
  if (rest.starts_with("http://")) {
    rest.remove_prefix(7);
  } else if (rest.find("://") != std::string_view::npos) {
    return InvalidArgument("unsupported URL scheme in " + std::string(url) + "; use http://");
  }
  std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? "" : rest.substr(slash);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);

  HttpClient client;
  std::string_view port = "80";
  if (authority.starts_with("[")) {
    std::size_t close = authority.find(']');
    if (close == std::string_view::npos) return InvalidArgument("bad URL: " + std::string(url));
    client.host_ = authority.substr(1, close - 1);
    std::string_view after = authority.substr(close + 1);
    if (after.starts_with(":"))
      port = after.substr(1);
    else if (!after.empty())
      return InvalidArgument("bad URL: " + std::string(url));
  } else {
    std::size_t colon = authority.rfind(':');
    client.host_ = authority.substr(0, colon);
    if (colon != std::string_view::npos) port = authority.substr(colon + 1);
  }
  if (client.host_.empty() || port.empty() ||
      port.find_first_not_of("0123456789") != std::string_view::npos) {
    return InvalidArgument("bad URL: " + std::string(url) + " (expected http://HOST:PORT)");
  }
  client.port_ = port;
  client.prefix_ = path;
  client.token_ = std::move(token);
  client.url_ = "http://" + HostHeader(client.host_, client.port_) + client.prefix_;
  return client;
}

Result<HttpResult> HttpClient::Call(std::string_view method, std::string_view target,
                                    const std::optional<Json>& body, const Headers& extra_headers,
                                    std::chrono::seconds timeout) const {
  http::verb verb = http::string_to_verb(method);
  if (verb == http::verb::unknown) return InvalidArgument("unknown method " + std::string(method));

  net::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.expires_after(timeout);
  KEEL_RETURN_IF_ERROR(Connect(ioc, stream, host_, port_, url_));

  http::request<http::string_body> req{verb, prefix_ + std::string(target), 11};
  SetCommonHeaders(req, host_, port_, token_, extra_headers);
  req.set(http::field::accept, "application/json");
  if (body) {
    req.set(http::field::content_type, "application/json");
    req.body() = DumpJson(*body);
  }
  req.prepare_payload();
  beast::error_code ec =
      RunOp(ioc, [&](auto handler) { http::async_write(stream, req, std::move(handler)); });
  if (ec) return TransportError("cannot send to", url_, ec);

  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(kMaxResponseBody);
  ec = RunOp(ioc,
             [&](auto handler) { http::async_read(stream, buffer, parser, std::move(handler)); });
  if (ec) return TransportError("no answer from", url_, ec);

  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  HttpResult result;
  result.status = parser.get().result_int();
  result.body = std::move(parser.get().body());
  return result;
}

Result<HttpClient::Opened> HttpClient::OpenStream(std::string_view target,
                                                  const Headers& extra_headers) const {
  auto impl = std::make_unique<SseStream::Impl>();
  impl->url = url_;
  impl->parser.body_limit(boost::none);  // an event stream has no natural end
  impl->stream.expires_after(kConnectTimeout);
  KEEL_RETURN_IF_ERROR(Connect(impl->ioc, impl->stream, host_, port_, url_));

  http::request<http::empty_body> req{http::verb::get, prefix_ + std::string(target), 11};
  SetCommonHeaders(req, host_, port_, token_, extra_headers);
  req.set(http::field::accept, "text/event-stream");
  req.set(http::field::cache_control, "no-cache");
  beast::error_code ec = RunOp(
      impl->ioc, [&](auto handler) { http::async_write(impl->stream, req, std::move(handler)); });
  if (ec) return TransportError("cannot send to", url_, ec);
  ec = RunOp(impl->ioc, [&](auto handler) {
    http::async_read_header(impl->stream, impl->buffer, impl->parser, std::move(handler));
  });
  if (ec) return TransportError("no answer from", url_, ec);

  Opened opened;
  int status = impl->parser.get().result_int();
  if (status != 200) {
    // An error answer has a short JSON body; collect it for the caller's message.
    opened.error.status = status;
    while (!impl->ended) {
      if (!impl->ReadSome().ok()) break;
    }
    opened.error.body = std::move(impl->pending);
    return opened;
  }
  impl->stream.expires_never();
  opened.stream = std::make_unique<SseStream>(std::move(impl));
  return opened;
}

Result<HttpResult> HttpClient::Stream(std::string_view target, const Headers& extra_headers,
                                      const std::function<bool(const SseEvent&)>& on_event) const {
  KEEL_ASSIGN_OR_RETURN(Opened opened, OpenStream(target, extra_headers));
  if (!opened.stream) return opened.error;
  while (true) {
    KEEL_ASSIGN_OR_RETURN(std::optional<SseEvent> event, opened.stream->Next());
    if (!event || !on_event(*event)) break;
  }
  return HttpResult{200, ""};
}

}  // namespace keel::cli
