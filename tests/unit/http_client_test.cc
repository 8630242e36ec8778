// http::Client's keep-alive: a response read to its end leaves its connection for the next
// request to the same origin, and a kept connection the server closed meanwhile is replaced
// without the caller seeing a failure. And its TLS: a server is trusted through the system's
// store or the configured CA file only. Against real servers on loopback sockets.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "keel/http/client.h"

namespace keel::http {
namespace {

// A socket listening on 127.0.0.1 at a port the system chose (set in `port`).
int ListenOnLoopback(int& port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(::listen(fd, 16), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(addr.sin_port);
  return fd;
}

// Answers "ok" to each request; after `per_connection` answers it closes the connection (the
// way servers end idle keep-alive connections), without telling the client first.
class CountingServer {
 public:
  explicit CountingServer(int per_connection) : per_connection_(per_connection) {
    fd_ = ListenOnLoopback(port_);
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

// A self-signed certificate for 127.0.0.1 and its key, made here (no fixture files to expire).
struct SelfSigned {
  SelfSigned() {
    key = EVP_EC_gen("P-256");
    cert = X509_new();
    X509_set_version(cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
    X509_gmtime_adj(X509_getm_notBefore(cert), -60);
    X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
    X509_NAME* name = X509_get_subject_name(cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                               reinterpret_cast<const unsigned char*>("keel test"), -1, -1, 0);
    X509_set_issuer_name(cert, name);
    X509_set_pubkey(cert, key);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
    for (const char* ext : {"subjectAltName=IP:127.0.0.1", "basicConstraints=critical,CA:TRUE"}) {
      std::string text = ext;
      const size_t eq = text.find('=');
      X509_EXTENSION* e =
          X509V3_EXT_conf(nullptr, &ctx, text.substr(0, eq).c_str(), text.substr(eq + 1).c_str());
      X509_add_ext(cert, e, -1);
      X509_EXTENSION_free(e);
    }
    X509_sign(cert, key, EVP_sha256());
  }
  ~SelfSigned() {
    X509_free(cert);
    EVP_PKEY_free(key);
  }
  // Writes the certificate as PEM to `path`.
  void WritePem(const std::string& path) const {
    FILE* f = std::fopen(path.c_str(), "w");
    ASSERT_NE(f, nullptr);
    PEM_write_X509(f, cert);
    std::fclose(f);
  }
  EVP_PKEY* key = nullptr;
  X509* cert = nullptr;
};

// Answers "ok" over TLS with `identity`'s certificate, one request per connection. A handshake
// the client aborts (an untrusted certificate) just ends that connection.
class TlsServer {
 public:
  explicit TlsServer(const SelfSigned& identity) {
    ctx_ = SSL_CTX_new(TLS_server_method());
    SSL_CTX_use_certificate(ctx_, identity.cert);
    SSL_CTX_use_PrivateKey(ctx_, identity.key);
    fd_ = ListenOnLoopback(port_);
    thread_ = std::thread([this] { Serve(); });
  }
  ~TlsServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
    SSL_CTX_free(ctx_);
  }
  std::string url() const { return "https://127.0.0.1:" + std::to_string(port_) + "/v1/x"; }
  int answered() const { return answered_; }

 private:
  void Serve() {
    while (true) {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      SSL* ssl = SSL_new(ctx_);
      SSL_set_fd(ssl, c);
      if (SSL_accept(ssl) == 1) {
        std::string in;
        char buf[4096];
        while (in.find("\r\n\r\n") == std::string::npos) {
          int n = SSL_read(ssl, buf, sizeof buf);
          if (n <= 0) break;
          in.append(buf, static_cast<size_t>(n));
        }
        const std::string answer =
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
        if (SSL_write(ssl, answer.data(), static_cast<int>(answer.size())) > 0) ++answered_;
        SSL_shutdown(ssl);
      }
      SSL_free(ssl);
      ::close(c);
    }
  }
  SSL_CTX* ctx_ = nullptr;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<int> answered_{0};
  std::thread thread_;
};

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          (name + "-" + std::to_string(::getpid()) + ".pem"))
      .string();
}

TEST(HttpClientTlsTest, AServerSignedByTheConfiguredCaFileAnswers) {
  SelfSigned identity;
  TlsServer server(identity);
  const std::string pem = TempPath("keel-ca");
  identity.WritePem(pem);
  Client::Options options;
  options.ca_file = pem;
  Client client(options);
  EXPECT_EQ(FetchSeveral(client, server.url(), 2), std::vector<std::string>(2, "200 ok"));
  EXPECT_EQ(server.answered(), 2);
  std::filesystem::remove(pem);
}

TEST(HttpClientTlsTest, AServerTheTrustStoreDoesNotKnowGetsNoRequest) {
  SelfSigned identity;
  TlsServer server(identity);
  Client client;  // the system's trust store only
  auto got = FetchSeveral(client, server.url(), 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].rfind("unavailable: ", 0), 0u) << got[0];
  EXPECT_NE(got[0].find("certificate verify failed"), std::string::npos) << got[0];
  EXPECT_EQ(server.answered(), 0) << "no request is sent to an unverified server";
}

TEST(HttpClientTlsTest, AnotherServersCertificateIsRefusedEvenWithACaFile) {
  SelfSigned trusted, other;
  TlsServer server(other);
  const std::string pem = TempPath("keel-other-ca");
  trusted.WritePem(pem);
  Client::Options options;
  options.ca_file = pem;
  Client client(options);
  auto got = FetchSeveral(client, server.url(), 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_NE(got[0].find("certificate verify failed"), std::string::npos) << got[0];
  EXPECT_EQ(server.answered(), 0);
  std::filesystem::remove(pem);
}

TEST(HttpClientTlsTest, AMissingCaFileDisablesTlsAndSaysWhyUntilTheFileIsThere) {
  SelfSigned identity;
  TlsServer server(identity);
  const std::string pem = TempPath("keel-late-ca");
  std::filesystem::remove(pem);
  Client::Options options;
  options.ca_file = pem;
  {
    Client client(options);
    auto got = FetchSeveral(client, server.url(), 1);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_NE(got[0].find("TLS is unavailable: CA file '" + pem + "'"), std::string::npos)
        << got[0];
    EXPECT_EQ(server.answered(), 0);
    // Plain HTTP through the same client is unaffected.
    CountingServer plain(/*per_connection=*/1);
    EXPECT_EQ(FetchSeveral(client, plain.url(), 1), std::vector<std::string>(1, "200 ok"));
  }
  // The failure is not remembered: the file, once there, is read by the next request.
  identity.WritePem(pem);
  Client client(options);
  EXPECT_EQ(FetchSeveral(client, server.url(), 1), std::vector<std::string>(1, "200 ok"));
  std::filesystem::remove(pem);
}

TEST(HttpClientTlsTest, VerificationOffAcceptsAnyCertificate) {
  SelfSigned identity;
  TlsServer server(identity);
  Client::Options options;
  options.verify_peer = false;  // tests against self-signed servers only
  Client client(options);
  EXPECT_EQ(FetchSeveral(client, server.url(), 1), std::vector<std::string>(1, "200 ok"));
}

}  // namespace
}  // namespace keel::http
