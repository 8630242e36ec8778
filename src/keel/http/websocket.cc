#include "keel/http/websocket.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/websocket.hpp>

#include <memory>

#include "keel/http/types.h"

namespace keel::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = boost::beast::websocket;

namespace {

using Socket = websocket::stream<beast::tcp_stream>;

class WebSocketWriter final : public StreamWriter {
 public:
  WebSocketWriter(Socket& ws, const bool& closed) : ws_(ws), closed_(closed) {}

  asio::awaitable<bool> Write(std::string data) override {
    if (closed_) co_return false;
    boost::system::error_code ec;
    ws_.text(true);
    co_await ws_.async_write(asio::buffer(data), asio::redirect_error(asio::use_awaitable, ec));
    co_return !ec;
  }

  asio::awaitable<bool> Ping() override {
    if (closed_) co_return false;
    boost::system::error_code ec;
    co_await ws_.async_ping({}, asio::redirect_error(asio::use_awaitable, ec));
    co_return !ec;
  }

  void EndForRestart() override { restart_ = true; }
  bool restart() const { return restart_; }

 private:
  Socket& ws_;
  const bool& closed_;
  bool restart_ = false;
};

// Reads until the client closes or the connection fails; Beast answers pings and the close
// handshake while a read is pending. Sets `closed` at the end.
asio::awaitable<void> ReadUntilClosed(std::shared_ptr<Socket> ws, std::shared_ptr<bool> closed) {
  beast::flat_buffer buffer;
  while (true) {
    boost::system::error_code ec;
    co_await ws->async_read(buffer, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) break;
    buffer.consume(buffer.size());
  }
  *closed = true;
}

}  // namespace

asio::awaitable<void> ServeWebSocket(beast::tcp_stream stream,
                                     beast::http::request<beast::http::string_body> request,
                                     Response response) {
  // Shared with the reader, which may outlive this coroutine by a close handshake.
  auto ws = std::make_shared<Socket>(std::move(stream));
  auto closed = std::make_shared<bool>(false);
  ws->set_option(websocket::stream_base::timeout::suggested(beast::role_type::server));
  ws->set_option(websocket::stream_base::decorator([](websocket::response_type& res) {
    res.set(beast::http::field::server, "keel");
  }));
  ws->read_message_max(kMaxWebSocketClientMessage);
  boost::system::error_code ec;
  co_await ws->async_accept(request, asio::redirect_error(asio::use_awaitable, ec));
  if (ec) co_return;  // Beast answered a malformed handshake with 400
  asio::co_spawn(ws->get_executor(), ReadUntilClosed(ws, closed), asio::detached);
  WebSocketWriter writer(*ws, *closed);
  co_await response.stream(writer);
  if (!*closed) {
    co_await ws->async_close(
        writer.restart() ? websocket::close_code::service_restart : websocket::close_code::normal,
        asio::redirect_error(asio::use_awaitable, ec));
  }
}

}  // namespace keel::http
