// OpenAiProvider against tests/fakes/fake_openai.py, a local server speaking the real wire format
// (chunked event streams cut at odd byte boundaries, error bodies, Retry-After, dropped
// connections). The fake picks its behaviour from the model name; see its SCENARIOS table.

#include "keel/model/openai_provider.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "keel/http/client.h"

extern char** environ;

namespace keel::model {
namespace {

using std::chrono::milliseconds;

// The fake server as a child process. Its stdin is a pipe we hold: when this process goes away,
// however it goes, the fake reads EOF and exits.
class FakeOpenAiServer {
 public:
  static std::unique_ptr<FakeOpenAiServer> Start() {
    int in[2];
    int out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) return nullptr;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    std::string script = std::string(KEEL_TEST_FAKES_DIR) + "/fake_openai.py";
    char* argv[] = {const_cast<char*>("python3"), const_cast<char*>(script.c_str()), nullptr};
    pid_t pid = -1;
    int rc = posix_spawnp(&pid, "python3", &actions, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    if (rc != 0) {
      close(in[1]);
      close(out[0]);
      return nullptr;
    }
    auto server = std::unique_ptr<FakeOpenAiServer>(new FakeOpenAiServer(pid, in[1]));
    // The first line of its output is the port.
    std::string line;
    while (line.find('\n') == std::string::npos) {
      pollfd pfd{out[0], POLLIN, 0};
      if (poll(&pfd, 1, 10000) <= 0) break;
      char buf[64];
      ssize_t n = read(out[0], buf, sizeof(buf));
      if (n <= 0) break;
      line.append(buf, static_cast<size_t>(n));
    }
    close(out[0]);
    server->port_ = std::atoi(line.c_str());
    if (server->port_ <= 0) return nullptr;
    return server;
  }

  ~FakeOpenAiServer() {
    close(stdin_);
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
  }

  int port() const { return port_; }
  std::string base_url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/v1"; }

 private:
  FakeOpenAiServer(pid_t pid, int stdin_fd) : pid_(pid), stdin_(stdin_fd) {}
  pid_t pid_;
  int stdin_;
  int port_ = 0;
};

struct Outcome {
  std::optional<Result<ModelResponse>> result;
  std::vector<std::string> deltas;
  double seconds = 0;

  std::string Text() const {
    std::string all;
    for (const auto& d : deltas) all += d;
    return all;
  }
};

boost::asio::awaitable<void> CallComplete(Provider& provider, ModelRequest request,
                                          Outcome& outcome) {
  outcome.result = co_await provider.Complete(
      request, [&outcome](const std::string& delta) { outcome.deltas.push_back(delta); });
}

// Runs one call to completion on a local io_context.
Outcome RunComplete(Provider& provider, const ModelRequest& request) {
  Outcome outcome;
  boost::asio::io_context io;
  auto start = std::chrono::steady_clock::now();
  boost::asio::co_spawn(io, CallComplete(provider, request, outcome), [](std::exception_ptr e) {
    if (e) ADD_FAILURE() << "Complete threw";
  });
  io.run_for(std::chrono::seconds(60));
  outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_TRUE(outcome.result.has_value()) << "Complete did not finish";
  return outcome;
}

const std::string kLongTool = "mcp__a_server_with_a_long_name__" + std::string(50, 'x') + ".read";

// A request with history (an earlier tool call and its result) and three tools, one of whose
// names is too long for OpenAI. `user` keys the fake's per-test request counter.
ModelRequest MakeRequest(const std::string& model, const std::string& user) {
  ModelRequest r;
  r.model = model;
  r.messages.push_back({"system", "be brief", {}, "", ""});
  r.messages.push_back({"user", "earlier question", {}, "", ""});
  ChatMessage assistant{"assistant", "", {}, "", ""};
  assistant.tool_calls.push_back({"call_prev", "notes.append", Json{{"text", "earlier"}}});
  r.messages.push_back(assistant);
  r.messages.push_back({"tool", "{\"ok\":true}", {}, "call_prev", "notes.append"});
  r.messages.push_back({"user", user, {}, "", ""});
  Json params = {{"type", "object"}, {"properties", {{"text", {{"type", "string"}}}}}};
  r.tools.push_back({"notes.append", "Appends a note", params});
  r.tools.push_back({"mcp__fs__read_file", "Reads a file", Json::object()});
  r.tools.push_back({kLongTool, "Reads through a long-named server", Json::object()});
  return r;
}

class OpenAiProviderTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { fake_ = FakeOpenAiServer::Start().release(); }
  static void TearDownTestSuite() {
    delete fake_;
    fake_ = nullptr;
  }

  void SetUp() override { ASSERT_NE(fake_, nullptr) << "the fake OpenAI server did not start"; }

  config::OpenAiConfig Config() const {
    config::OpenAiConfig c;
    c.base_url = fake_->base_url();
    c.api_key = "test-key";
    c.timeout_ms = 5000;
    c.max_retries = 2;
    return c;
  }

  static OpenAiProvider::Backoff FastBackoff() {
    OpenAiProvider::Backoff b;
    b.initial = milliseconds(5);
    b.max = milliseconds(20);
    return b;
  }

  // Requests the fake has seen whose last user message is `user`.
  int RequestCount(const std::string& user) {
    http::Client client;
    http::ClientRequest req;
    req.url = "http://127.0.0.1:" + std::to_string(fake_->port()) + "/_count?user=" + user;
    std::optional<Result<http::ClientResponse>> got;
    boost::asio::io_context io;
    boost::asio::co_spawn(
        io, [&]() -> boost::asio::awaitable<void> { got = co_await client.Fetch(req); },
        [](std::exception_ptr) {});
    io.run_for(std::chrono::seconds(10));
    if (!got || !got->ok() || (*got)->status != 200) return -1;
    auto body = ParseJsonObject((*got)->body);
    return body.ok() ? body->value("count", -1) : -1;
  }

  Outcome Call(const std::string& model, const std::string& user,
               std::optional<config::OpenAiConfig> config = std::nullopt) {
    OpenAiProvider provider(config ? *config : Config(), FastBackoff());
    return RunComplete(provider, MakeRequest(model, user));
  }

  static FakeOpenAiServer* fake_;
};

FakeOpenAiServer* OpenAiProviderTest::fake_ = nullptr;

TEST_F(OpenAiProviderTest, StreamsTextDeltasAndUsage) {
  Outcome out = Call("stream-text", "StreamsTextDeltasAndUsage");
  ASSERT_TRUE(out.result->ok()) << out.result->status().ToString();
  EXPECT_EQ((*out.result)->text, "Hello, world");
  EXPECT_EQ(out.Text(), "Hello, world");
  EXPECT_EQ(out.deltas.size(), 3u);
  EXPECT_TRUE((*out.result)->tool_calls.empty());
  EXPECT_EQ((*out.result)->usage.input_tokens, 12);
  EXPECT_EQ((*out.result)->usage.output_tokens, 5);
}

TEST_F(OpenAiProviderTest, StreamsToolCallsSplitAcrossChunks) {
  Outcome out = Call("stream-tools", "StreamsToolCallsSplitAcrossChunks");
  ASSERT_TRUE(out.result->ok()) << out.result->status().ToString();
  const ModelResponse& r = **out.result;
  EXPECT_EQ(r.text, "Let me check.");
  EXPECT_EQ(out.Text(), "Let me check.");
  ASSERT_EQ(r.tool_calls.size(), 2u);
  EXPECT_EQ(r.tool_calls[0].id, "call_a");
  EXPECT_EQ(r.tool_calls[0].name, "notes.append");
  EXPECT_EQ(r.tool_calls[0].arguments, (Json{{"text", "hi"}}));
  EXPECT_EQ(r.tool_calls[1].id, "call_b");
  EXPECT_EQ(r.tool_calls[1].name, kLongTool);
  EXPECT_EQ(r.tool_calls[1].arguments, (Json{{"path", "/tmp/x"}}));
  EXPECT_EQ(r.usage.input_tokens, 42);
  EXPECT_EQ(r.usage.output_tokens, 17);
}

TEST_F(OpenAiProviderTest, ReadsCrlfAndConnectionCloseDelimitedStreams) {
  for (const char* model : {"stream-crlf", "eof-stream"}) {
    Outcome out = Call(model, std::string("ReadsCrlfAndEofStreams-") + model);
    ASSERT_TRUE(out.result->ok()) << model << ": " << out.result->status().ToString();
    EXPECT_EQ((*out.result)->text, "Hello, world") << model;
    EXPECT_EQ((*out.result)->usage.output_tokens, 5) << model;
  }
}

TEST_F(OpenAiProviderTest, AcceptsANonStreamedJsonBody) {
  Outcome out = Call("json-body", "AcceptsANonStreamedJsonBody");
  ASSERT_TRUE(out.result->ok()) << out.result->status().ToString();
  EXPECT_EQ((*out.result)->text, "Done in one.");
  EXPECT_EQ(out.Text(), "Done in one.");
  ASSERT_EQ((*out.result)->tool_calls.size(), 1u);
  EXPECT_EQ((*out.result)->tool_calls[0].name, "notes.append");
  EXPECT_EQ((*out.result)->tool_calls[0].arguments, (Json{{"text", "j"}}));
  EXPECT_EQ((*out.result)->usage.input_tokens, 7);
}

TEST_F(OpenAiProviderTest, HonoursRetryAfterOn429) {
  Outcome out = Call("rate-limited-once", "HonoursRetryAfterOn429");
  ASSERT_TRUE(out.result->ok()) << out.result->status().ToString();
  EXPECT_EQ(out.Text(), "Hello, world");
  EXPECT_GE(out.seconds, 0.95);  // Retry-After: 1, not the 5 ms backoff
  EXPECT_EQ(RequestCount("HonoursRetryAfterOn429"), 2);
}

TEST_F(OpenAiProviderTest, GivesUpAfterMaxRetriesWithUnavailable) {
  Outcome out = Call("rate-limited-always", "GivesUpAfterMaxRetries");
  ASSERT_FALSE(out.result->ok());
  EXPECT_EQ(out.result->status().code(), Code::kUnavailable);
  EXPECT_NE(out.result->status().message().find("429"), std::string::npos);
  EXPECT_NE(out.result->status().message().find("Rate limit reached"), std::string::npos);
  EXPECT_NE(out.result->status().message().find("3 attempts"), std::string::npos);
  EXPECT_EQ(RequestCount("GivesUpAfterMaxRetries"), 3);
}

TEST_F(OpenAiProviderTest, RetriesAServerError) {
  Outcome out = Call("server-error-once", "RetriesAServerError");
  ASSERT_TRUE(out.result->ok()) << out.result->status().ToString();
  EXPECT_EQ(out.Text(), "Hello, world");
  EXPECT_EQ(RequestCount("RetriesAServerError"), 2);
}

TEST_F(OpenAiProviderTest, RetriesAConnectionDroppedBeforeTheBody) {
  Outcome out = Call("drop-before-body-once", "RetriesAConnectionDroppedBeforeTheBody");
  ASSERT_TRUE(out.result->ok()) << out.result->status().ToString();
  EXPECT_EQ(out.Text(), "Hello, world");
  EXPECT_EQ(RequestCount("RetriesAConnectionDroppedBeforeTheBody"), 2);
}

TEST_F(OpenAiProviderTest, DropMidStreamFailsWithoutRepeatingDeltas) {
  Outcome out = Call("drop", "DropMidStreamFails");
  ASSERT_FALSE(out.result->ok());
  EXPECT_EQ(out.result->status().code(), Code::kUnavailable);
  EXPECT_NE(out.result->status().message().find("broke off"), std::string::npos)
      << out.result->status().message();
  EXPECT_EQ(out.deltas, (std::vector<std::string>{"Partial ", "answer"}));
  EXPECT_EQ(RequestCount("DropMidStreamFails"), 1);
}

TEST_F(OpenAiProviderTest, StalledStreamTimesOut) {
  config::OpenAiConfig config = Config();
  config.timeout_ms = 300;
  Outcome out = Call("slow", "StalledStreamTimesOut", config);
  ASSERT_FALSE(out.result->ok());
  EXPECT_EQ(out.result->status().code(), Code::kUnavailable);
  EXPECT_NE(out.result->status().message().find("300 ms"), std::string::npos)
      << out.result->status().message();
  EXPECT_EQ(out.Text(), "Thinking");
  EXPECT_LT(out.seconds, 2.5);
}

TEST_F(OpenAiProviderTest, GarbageIsAClearError) {
  for (const char* model : {"garbage", "garbage-stream"}) {
    Outcome out = Call(model, std::string("GarbageIsAClearError-") + model);
    ASSERT_FALSE(out.result->ok()) << model;
    EXPECT_EQ(out.result->status().code(), Code::kUnavailable) << model;
    EXPECT_NE(out.result->status().message().find("JSON"), std::string::npos)
        << out.result->status().message();
  }
}

TEST_F(OpenAiProviderTest, InvalidToolArgumentsAreAClearError) {
  Outcome out = Call("bad-args", "InvalidToolArguments");
  ASSERT_FALSE(out.result->ok());
  EXPECT_EQ(out.result->status().code(), Code::kUnavailable);
  EXPECT_NE(out.result->status().message().find("notes.append"), std::string::npos)
      << out.result->status().message();
  EXPECT_NE(out.result->status().message().find("not valid JSON"), std::string::npos);
}

// The gateway, not the provider, turns it down (as an unknown tool the model then reads about).
TEST_F(OpenAiProviderTest, UnknownToolFromTheModelPassesThroughUndecoded) {
  Outcome out = Call("unknown-tool", "UnknownToolFromTheModel");
  ASSERT_TRUE(out.result->ok()) << out.result->status().ToString();
  ASSERT_EQ((*out.result)->tool_calls.size(), 1u);
  EXPECT_NE((*out.result)->tool_calls[0].name.find("no_such_tool"), std::string::npos);
}

TEST_F(OpenAiProviderTest, BadRequestFailsAtOnceWithTheServersMessage) {
  Outcome out = Call("bad-request", "BadRequestFailsAtOnce");
  ASSERT_FALSE(out.result->ok());
  EXPECT_EQ(out.result->status().code(), Code::kInvalidArgument);
  EXPECT_NE(out.result->status().message().find("string too long"), std::string::npos)
      << out.result->status().message();
  EXPECT_EQ(RequestCount("BadRequestFailsAtOnce"), 1);
}

TEST_F(OpenAiProviderTest, UnknownModelIsNotFound) {
  Outcome out = Call("no-such-model", "UnknownModelIsNotFound");
  ASSERT_FALSE(out.result->ok());
  EXPECT_EQ(out.result->status().code(), Code::kNotFound);
  EXPECT_NE(out.result->status().message().find("does not exist"), std::string::npos);
}

TEST_F(OpenAiProviderTest, WrongKeyIsUnauthenticated) {
  config::OpenAiConfig config = Config();
  config.api_key = "wrong-key";
  Outcome out = Call("stream-text", "WrongKeyIsUnauthenticated", config);
  ASSERT_FALSE(out.result->ok());
  EXPECT_EQ(out.result->status().code(), Code::kUnauthenticated);
  EXPECT_NE(out.result->status().message().find("Incorrect API key"), std::string::npos);
}

TEST_F(OpenAiProviderTest, LocalServerNeedsNoKey) {
  config::OpenAiConfig config = Config();
  config.api_key = "";
  Outcome out = Call("no-auth-ok", "LocalServerNeedsNoKey", config);
  ASSERT_TRUE(out.result->ok()) << out.result->status().ToString();
  EXPECT_EQ((*out.result)->text, "Hello, world");
}

TEST_F(OpenAiProviderTest, MissingKeyForOpenAiNamesTheVariable) {
  config::OpenAiConfig config;  // https://api.openai.com/v1, no key
  config.api_key = "";
  Outcome out = Call("gpt-4o-mini", "MissingKey", config);
  ASSERT_FALSE(out.result->ok());
  EXPECT_EQ(out.result->status().code(), Code::kUnauthenticated);
  EXPECT_NE(out.result->status().message().find("OPENAI_API_KEY"), std::string::npos);
  EXPECT_TRUE(out.deltas.empty());
}

TEST_F(OpenAiProviderTest, UnreachableServerIsUnavailableAfterRetries) {
  // A port that was free a moment ago: nothing listens there.
  int port = 0;
  {
    boost::asio::io_context io;
    boost::asio::ip::tcp::acceptor acceptor(
        io, boost::asio::ip::tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
    port = acceptor.local_endpoint().port();
  }
  config::OpenAiConfig config = Config();
  config.base_url = "http://127.0.0.1:" + std::to_string(port) + "/v1/";
  Outcome out = Call("stream-text", "Unreachable", config);
  ASSERT_FALSE(out.result->ok());
  EXPECT_EQ(out.result->status().code(), Code::kUnavailable);
  EXPECT_NE(out.result->status().message().find("3 attempts"), std::string::npos)
      << out.result->status().message();
}

TEST_F(OpenAiProviderTest, MalformedBaseUrlIsInvalidArgument) {
  config::OpenAiConfig config = Config();
  config.base_url = "ftp://example.com/v1";
  Outcome out = Call("stream-text", "MalformedBaseUrl", config);
  ASSERT_FALSE(out.result->ok());
  EXPECT_EQ(out.result->status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace keel::model
