// keel_fake_openai: an OpenAI Chat Completions server that answers at once, for measuring what
// Keel itself costs per turn on the OpenAI provider's path (bench/quick.py).
//
//   keel_fake_openai [--port-file FILE]
//
// Listens on 127.0.0.1 at an ephemeral port (printed on stdout, and written to FILE), keeps
// connections alive, and answers every POST .../chat/completions with a streamed answer in the
// real wire format: text/event-stream chunks ("chat.completion.chunk") for the role, the text in
// three pieces, finish_reason "stop", a usage chunk (stream_options.include_usage), then
// "data: [DONE]". Anything else is a 404. One thread; it does no work a real server would not.

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <cstdio>
#include <fstream>
#include <string>

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

std::string Chunk(const std::string& delta, const std::string& finish, bool usage = false) {
  std::string obj = R"({"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"bench",)";
  if (usage) {
    obj += R"("choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}})";
  } else {
    obj += R"("choices":[{"index":0,"delta":)" + delta + R"(,"finish_reason":)" + finish + "}]}";
  }
  return "data: " + obj + "\n\n";
}

const std::string& Answer() {
  static const std::string kAnswer =
      Chunk(R"({"role":"assistant","content":""})", "null") + Chunk(R"({"content":"Hel"})", "null") +
      Chunk(R"({"content":"lo, "})", "null") + Chunk(R"({"content":"world"})", "null") +
      Chunk("{}", R"("stop")") + Chunk("", "", true) + "data: [DONE]\n\n";
  return kAnswer;
}

asio::awaitable<void> Serve(tcp::socket socket) {
  beast::flat_buffer buffer;
  try {
    while (true) {
      http::request<http::string_body> req;
      co_await http::async_read(socket, buffer, req, asio::use_awaitable);
      http::response<http::string_body> res;
      res.version(11);
      res.keep_alive(req.keep_alive());
      const std::string target(req.target());
      if (req.method() == http::verb::post &&
          target.size() >= 17 && target.compare(target.size() - 17, 17, "/chat/completions") == 0) {
        res.result(http::status::ok);
        res.set(http::field::content_type, "text/event-stream");
        res.body() = Answer();
      } else {
        res.result(http::status::not_found);
        res.set(http::field::content_type, "application/json");
        res.body() = R"({"error":{"message":"not found","type":"invalid_request_error"}})";
      }
      res.prepare_payload();
      co_await http::async_write(socket, res, asio::use_awaitable);
      if (!req.keep_alive()) break;
    }
  } catch (const std::exception&) {
    // the client went away
  }
}

asio::awaitable<void> Listen(tcp::acceptor& acceptor) {
  while (true) {
    tcp::socket socket = co_await acceptor.async_accept(asio::use_awaitable);
    socket.set_option(tcp::no_delay(true));
    asio::co_spawn(acceptor.get_executor(), Serve(std::move(socket)), asio::detached);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string port_file;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--port-file" && i + 1 < argc) {
      port_file = argv[++i];
    } else {
      std::fprintf(stderr, "usage: keel_fake_openai [--port-file FILE]\n");
      return 2;
    }
  }
  asio::io_context io(1);
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const unsigned port = acceptor.local_endpoint().port();
  std::printf("%u\n", port);
  std::fflush(stdout);
  if (!port_file.empty()) std::ofstream(port_file) << port << "\n";
  asio::co_spawn(io, Listen(acceptor), asio::detached);
  io.run();
  return 0;
}
