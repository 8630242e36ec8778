// http::Client's keep-alive: a response read to its end leaves its connection for the next
// request to the same origin, and a kept connection the server closed meanwhile is replaced
// without the caller seeing a failure. Against a real server on a loopback socket.

#include "keel/http/client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <string>
#include <thread>
#include <vector>

namespace keel::http {
namespace {

// Answers "ok" to each request; after `per_connection` answers it closes the connection (the
// way servers end idle keep-alive connections), without telling the client first.
class CountingServer {
 public:
  explicit CountingServer(int per_connection) : per_connection_(per_connection) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~CountingServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1/x"; }
  int accepted() const { return accepted_; }

 private:
  void Serve() {
    while (true) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      ++accepted_;
      for (int served = 0; served < per_connection_; ++served) {
        std::string in;
        char buf[4096];
        while (in.find("\r\n\r\n") == std::string::npos) {
          ssize_t n = ::read(c, buf, sizeof buf);
          if (n <= 0) break;
          in.append(buf, static_cast<size_t>(n));
        }
        if (in.find("\r\n\r\n") == std::string::npos) break;
        const std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
        if (::write(c, answer.data(), answer.size()) != static_cast<ssize_t>(answer.size())) break;
      }
      ::close(c);
    }
  }
  int per_connection_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<int> accepted_{0};
  std::thread thread_;
};

// Sends `n` GETs one after the other through one client; the statuses and bodies.
std::vector<std::string> FetchSeveral(Client& client, const std::string& url, int n) {
  std::vector<std::string> out;
  boost::asio::io_context io;
  boost::asio::co_spawn(
      io,
      [&]() -> boost::asio::awaitable<void> {
        for (int i = 0; i < n; ++i) {
          ClientRequest req;
          req.url = url;
          req.timeout = std::chrono::milliseconds(5000);
          auto res = co_await client.Fetch(req);
          out.push_back(res.ok() ? std::to_string(res->status) + " " + res->body
                                 : res.status().ToString());
          // Let the server close a connection it is done with before the next request goes out.
          boost::asio::steady_timer pause(io, std::chrono::milliseconds(20));
          co_await pause.async_wait(boost::asio::use_awaitable);
        }
      },
      boost::asio::detached);
  io.run();
  return out;
}

TEST(HttpClientTest, KeepsTheConnectionForTheNextRequestToTheSameOrigin) {
  CountingServer server(/*per_connection=*/100);
  Client client;
  auto got = FetchSeveral(client, server.url(), 5);
  EXPECT_EQ(got, std::vector<std::string>(5, "200 ok"));
  EXPECT_EQ(server.accepted(), 1) << "all five requests on one connection";
}

TEST(HttpClientTest, AConnectionTheServerClosedIsReplacedWithoutAFailure) {
  CountingServer server(/*per_connection=*/1);  // closes after each answer, unannounced
  Client client;
  auto got = FetchSeveral(client, server.url(), 3);
  EXPECT_EQ(got, std::vector<std::string>(3, "200 ok"));
  EXPECT_EQ(server.accepted(), 3);
}

TEST(HttpClientTest, ClientsDoNotShareConnections) {
  CountingServer server(/*per_connection=*/100);
  Client a, b;
  EXPECT_EQ(FetchSeveral(a, server.url(), 2), std::vector<std::string>(2, "200 ok"));
  EXPECT_EQ(FetchSeveral(b, server.url(), 2), std::vector<std::string>(2, "200 ok"));
  EXPECT_EQ(server.accepted(), 2) << "one connection per client (each has its own guard)";
}

}  // namespace
}  // namespace keel::http
