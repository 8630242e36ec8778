#pragma once
// The server's WebSocket side (RFC 6455, on Boost.Beast): for an upgrade request whose route
// answered with a stream, completes the handshake and hands the route's stream a writer of
// text messages (one Write, one message; Ping a ping frame). Beast answers the client's pings
// and close frames; anything else the client sends is read and dropped. When the stream
// returns, the server closes the socket with a normal close frame.
//
// Only server.cc includes this header (it carries Beast's HTTP types).

#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

namespace keel::http {

struct Response;

// The most a client may send in one message: it has nothing to say but control frames.
inline constexpr size_t kMaxWebSocketClientMessage = 64 * 1024;

boost::asio::awaitable<void> ServeWebSocket(
    boost::beast::tcp_stream stream,
    boost::beast::http::request<boost::beast::http::string_body> request, Response response);

}  // namespace keel::http
