// keel_loadgen: end-to-end turns through Keel's HTTP API on the built-in local model.
//
// One io_context thread; C virtual clients, each a coroutine with its own keep-alive connection
// and its own session (runs are serial per session). Setup creates one agent (model "local")
// and the C sessions; then every client loops
//     POST /v1/sessions/{id}/messages?wait=30   {"content":"hello"}
// asserting status 200 and run status "done". A turn is one such request: message -> run done.
// Latency is measured per request from just before the write to the end of the response read.
//
//   keel_loadgen --url http://127.0.0.1:7878 --token TOKEN [--token-file FILE]
//                --concurrency 64 [--duration 10 | --turns N] [--warmup 2]
//                [--model MODEL] [--agent-config JSON] [--unique-messages] [--front openai]
//
// --model sets the agent's model (default "local"; e.g. "openai/bench" against
// keel_fake_openai); --agent-config sets the agent's config (e.g. '{"cache":false}');
// --unique-messages numbers each message ("hello 17") so that no two turns send the same request
// (response cache misses);
// --front openai sends each turn through the OpenAI-compatible front door instead:
//     POST /v1/chat/completions  X-Keel-Session: {id}  {"model":AGENT_ID,"messages":[...]}
// asserting status 200 and finish_reason "stop" (the same turn: message -> run done).
// --latencies FILE writes each measured turn's latency in ms, one a line, in the order they ended.
//
// --url may be given several times (several nodes on one database): setup goes through the
// first, client i uses url i % count, and the store counters are summed over all of them.
//
// Prints a human summary and one machine-readable line:
//   RESULT nodes=1 concurrency=64 turns=... seconds=... turns_per_s=... p50_ms=... p99_ms=...
//   max_ms=...
//          errors=... commits=... units=... units_per_commit=... cpu_main_us=... cpu_other_us=...
//          early_ms=... late_ms=...
// (commits/units are the deltas of keel_store_commits_total / keel_store_units_total from
// /metrics over the measured phase; cpu_* the server's CPU per turn over the same phase, from
// /proc/PID/task/*/stat, when --server-pid is given: the main thread runs the io_context, the
// others are the store's writer; early_ms/late_ms are the median latencies of the measured phase's
// turns 6-25 and of its last twenty). Exit status 1 when any turn failed.

#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using Json = nlohmann::json;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

struct Target {
  std::string host;
  std::string port;
};

struct Options {
  std::vector<Target> targets;
  std::string token;
  int concurrency = 1;
  double duration_s = 10;
  int64_t turns = 0;  // > 0: stop after this many measured turns instead of after duration_s
  double warmup_s = 0;
  int server_pid = 0;  // > 0: report the server's CPU per turn from /proc/PID/task/*/stat
  Json agent_config = Json::object();
  bool unique_messages = false;
  bool openai_front = false;    // --front openai
  std::string model = "local";  // the benchmark agent's model
  std::string latencies_file;   // --latencies: each measured turn's latency in ms, one a line
};

[[noreturn]] void Usage(const char* msg) {
  std::fprintf(stderr,
               "keel_loadgen: %s\nusage: keel_loadgen --url http://HOST:PORT (--token T | "
               "--token-file F) [--concurrency C] [--duration SECONDS | --turns N] "
               "[--warmup SECONDS] [--server-pid PID] [--model MODEL] [--agent-config JSON] "
               "[--unique-messages] [--front openai] [--latencies FILE]\n",
               msg);
  std::exit(2);
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Usage(("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--url") {
      std::string url = next();
      if (url.rfind("http://", 0) == 0) url = url.substr(7);
      if (!url.empty() && url.back() == '/') url.pop_back();
      auto colon = url.rfind(':');
      if (colon == std::string::npos) Usage("--url needs HOST:PORT");
      o.targets.push_back({url.substr(0, colon), url.substr(colon + 1)});
    } else if (a == "--token") {
      o.token = next();
    } else if (a == "--token-file") {
      std::ifstream in(next());
      std::getline(in, o.token);
    } else if (a == "--concurrency" || a == "-c") {
      o.concurrency = std::stoi(next());
    } else if (a == "--duration") {
      o.duration_s = std::stod(next());
    } else if (a == "--turns") {
      o.turns = std::stoll(next());
    } else if (a == "--warmup") {
      o.warmup_s = std::stod(next());
    } else if (a == "--server-pid") {
      o.server_pid = std::stoi(next());
    } else if (a == "--agent-config") {
      o.agent_config = Json::parse(next(), nullptr, /*allow_exceptions=*/false);
      if (!o.agent_config.is_object()) Usage("--agent-config must be a JSON object");
    } else if (a == "--unique-messages") {
      o.unique_messages = true;
    } else if (a == "--front") {
      std::string f = next();
      if (f != "openai") Usage("--front takes openai");
      o.openai_front = true;
    } else if (a == "--model") {
      o.model = next();
    } else if (a == "--latencies") {
      o.latencies_file = next();
    } else {
      Usage(("unknown argument " + a).c_str());
    }
  }
  while (!o.token.empty() && (o.token.back() == '\n' || o.token.back() == '\r' || o.token.back() == ' ')) {
    o.token.pop_back();
  }
  if (o.token.empty()) Usage("a token is required");
  if (o.targets.empty()) o.targets.push_back({"127.0.0.1", "7878"});
  if (o.concurrency < 1) Usage("--concurrency must be >= 1");
  return o;
}

// One keep-alive HTTP/1.1 connection.
class Conn {
 public:
  Conn(asio::io_context& io, const Options& o, std::string host)
      : stream_(io), opts_(o), host_(std::move(host)) {}

  asio::awaitable<void> Connect(const tcp::resolver::results_type& endpoints) {
    co_await stream_.async_connect(endpoints, asio::use_awaitable);
    stream_.socket().set_option(tcp::no_delay(true));
  }

  // Sent with every request from now on (--front openai: the client's session).
  void SetSessionHeader(std::string id) { session_header_ = std::move(id); }

  asio::awaitable<http::response<http::string_body>> Do(http::verb verb, const std::string& target,
                                                        std::string body) {
    http::request<http::string_body> req{verb, target, 11};
    req.set(http::field::host, host_);
    if (!session_header_.empty()) req.set("X-Keel-Session", session_header_);
    req.set(http::field::authorization, "Bearer " + opts_.token);
    req.keep_alive(true);
    if (verb == http::verb::post || !body.empty()) {
      req.set(http::field::content_type, "application/json");
      req.body() = std::move(body);
      req.prepare_payload();
    }
    stream_.expires_after(std::chrono::seconds(60));
    co_await http::async_write(stream_, req, asio::use_awaitable);
    http::response<http::string_body> res;
    co_await http::async_read(stream_, buffer_, res, asio::use_awaitable);
    stream_.expires_never();
    co_return res;
  }

 private:
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  const Options& opts_;
  std::string host_;
  std::string session_header_;
};

Json ParseOrThrow(const http::response<http::string_body>& res, unsigned want,
                  const std::string& what) {
  if (res.result_int() != want) {
    throw std::runtime_error(what + ": HTTP " + std::to_string(res.result_int()) + " " +
                             res.body().substr(0, 300));
  }
  return Json::parse(res.body());
}

// CPU seconds (user + system) of the process's main thread and of all its other threads.
struct ThreadCpu {
  double main_s = 0;
  double other_s = 0;
};
ThreadCpu ReadThreadCpu(int pid) {
  ThreadCpu c;
  if (pid <= 0) return c;
  const double hz = static_cast<double>(::sysconf(_SC_CLK_TCK));
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(
           "/proc/" + std::to_string(pid) + "/task", ec)) {
    std::ifstream in(entry.path() / "stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto close = stat.rfind(')');  // the command name may hold spaces; fields follow ')'
    if (close == std::string::npos) continue;
    std::istringstream fields(stat.substr(close + 2));
    std::string f;
    double utime = 0, stime = 0;
    for (int i = 3; fields >> f; ++i) {  // field 3 is the state; 14 utime, 15 stime
      if (i == 14) utime = std::stod(f);
      if (i == 15) {
        stime = std::stod(f);
        break;
      }
    }
    double secs = (utime + stime) / hz;
    if (entry.path().filename() == std::to_string(pid)) c.main_s += secs;
    else c.other_s += secs;
  }
  return c;
}

struct StoreCounters {
  double commits = 0;
  double units = 0;
};

asio::awaitable<StoreCounters> ReadStoreCounters(Conn& conn) {
  auto res = co_await conn.Do(http::verb::get, "/metrics", "");
  StoreCounters c;
  const std::string& b = res.body();
  auto value = [&](const std::string& name) -> double {
    auto pos = b.find("\n" + name + " ");
    if (pos == std::string::npos) return -1;
    return std::strtod(b.c_str() + pos + name.size() + 2, nullptr);
  };
  c.commits = value("keel_store_commits_total");
  c.units = value("keel_store_units_total");
  co_return c;
}

struct Shared {
  const Options* opts = nullptr;
  std::vector<std::string> sessions;
  Clock::time_point deadline;
  int64_t turn_budget = 0;  // remaining turns when --turns is set (single thread: no atomics)
  bool record = false;
  std::vector<int64_t> latencies_ns;  // of the measured phase
  int64_t errors = 0;
  std::string first_error;
  Clock::time_point last_done;
  int64_t messages_sent = 0;  // numbers the messages of --unique-messages
  std::string agent_id;
};

asio::awaitable<void> Client(Conn& conn, Shared& sh, const std::string& session_id) {
  const bool front = sh.opts->openai_front;
  const std::string target =
      front ? "/v1/chat/completions" : "/v1/sessions/" + session_id + "/messages?wait=30";
  if (front) conn.SetSessionHeader(session_id);
  while (Clock::now() < sh.deadline) {
    if (sh.record && sh.opts->turns > 0) {
      if (sh.turn_budget <= 0) break;
      --sh.turn_budget;
    }
    auto t0 = Clock::now();
    std::string why;
    try {
      std::string text = "hello";
      if (sh.opts->unique_messages) text += " " + std::to_string(++sh.messages_sent);
      std::string body = front ? Json{{"model", sh.agent_id},
                                      {"messages", {{{"role", "user"}, {"content", text}}}}}
                                     .dump()
                               : Json{{"content", text}}.dump();
      auto res = co_await conn.Do(http::verb::post, target, body);
      auto t1 = Clock::now();
      if (res.result_int() != 200) {
        why = "HTTP " + std::to_string(res.result_int()) + " " + res.body().substr(0, 300);
      } else {
        Json v = Json::parse(res.body(), nullptr, /*allow_exceptions=*/false);
        const Json* st = nullptr;
        const char* want = front ? "stop" : "done";
        if (front && v.is_object() && v.contains("choices") && v["choices"].is_array() &&
            !v["choices"].empty() && v["choices"][0].is_object()) {
          st = v["choices"][0].contains("finish_reason") ? &v["choices"][0]["finish_reason"]
                                                         : nullptr;
        } else if (!front && v.is_object() && v.contains("run") && v["run"].is_object() &&
                   v["run"].contains("status")) {
          st = &v["run"]["status"];
        }
        if (!st || !st->is_string() || st->get_ref<const std::string&>() != want) {
          why = "run not done: " + res.body().substr(0, 300);
        }
      }
      if (sh.record) {
        if (why.empty()) {
          sh.latencies_ns.push_back(
              std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
        }
        sh.last_done = t1;
      }
    } catch (const std::exception& e) {
      why = std::string("request failed: ") + e.what();
    }
    if (!why.empty()) {
      ++sh.errors;
      if (sh.first_error.empty()) sh.first_error = why;
      if (why.rfind("request failed", 0) == 0) co_return;  // the connection is gone
    }
  }
}

double PercentileMs(std::vector<int64_t>& v, double p) {
  if (v.empty()) return 0;
  size_t idx = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(idx), v.end());
  return static_cast<double>(v[idx]) / 1e6;
}

// Over a new connection to each target: one left idle through a long phase was closed by the
// server's idle timeout.
asio::awaitable<StoreCounters> SumStoreCounters(
    asio::io_context& io, const Options& o,
    const std::vector<tcp::resolver::results_type>& endpoints) {
  StoreCounters sum;
  for (size_t i = 0; i < endpoints.size(); ++i) {
    Conn conn(io, o, o.targets[i].host);
    co_await conn.Connect(endpoints[i]);
    StoreCounters c = co_await ReadStoreCounters(conn);
    sum.commits += c.commits;
    sum.units += c.units;
  }
  co_return sum;
}

asio::awaitable<int> Main(asio::io_context& io, const Options& o) {
  tcp::resolver resolver(io);
  std::vector<tcp::resolver::results_type> endpoints;
  for (const auto& t : o.targets) {
    endpoints.push_back(co_await resolver.async_resolve(t.host, t.port, asio::use_awaitable));
  }

  // Setup through the first target: an agent on the local model and one session per client.
  Conn admin(io, o, o.targets.front().host);
  co_await admin.Connect(endpoints.front());
  std::mt19937_64 rng(std::random_device{}());
  std::string agent_name = "loadgen-" + std::to_string(rng() % 1000000000);
  Json agent_body{{"name", agent_name}, {"model", o.model},
                  {"instructions", "keel_loadgen benchmark agent"}, {"config", o.agent_config}};
  auto agent = ParseOrThrow(
      co_await admin.Do(http::verb::post, "/v1/agents", agent_body.dump()), 201, "create agent");
  std::string agent_id = agent.at("id").get<std::string>();

  Shared sh;
  sh.opts = &o;
  sh.agent_id = agent_id;
  for (int i = 0; i < o.concurrency; ++i) {
    auto s = ParseOrThrow(co_await admin.Do(http::verb::post, "/v1/agents/" + agent_id + "/sessions",
                                            R"({"title":"loadgen"})"),
                          201, "create session");
    sh.sessions.push_back(s.at("id").get<std::string>());
  }
  std::vector<std::unique_ptr<Conn>> conns;
  for (int i = 0; i < o.concurrency; ++i) {
    conns.push_back(std::make_unique<Conn>(io, o, o.targets[i % o.targets.size()].host));
    co_await conns.back()->Connect(endpoints[i % endpoints.size()]);
  }

  // Runs every client until the deadline (or the turn budget) and waits for them all.
  auto phase = [&](double seconds, bool record) -> asio::awaitable<void> {
    sh.record = record;
    sh.turn_budget = o.turns;
    sh.deadline = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
    if (record && o.turns > 0) sh.deadline = Clock::now() + std::chrono::hours(1);
    int running = o.concurrency;
    asio::steady_timer all_done(io, Clock::time_point::max());
    for (int i = 0; i < o.concurrency; ++i) {
      asio::co_spawn(io, Client(*conns[i], sh, sh.sessions[i]),
                     [&](std::exception_ptr) {
                       if (--running == 0) all_done.expires_at(Clock::time_point::min());
                     });
    }
    boost::system::error_code ec;
    co_await all_done.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  };

  if (o.warmup_s > 0) {
    co_await phase(o.warmup_s, false);
    if (sh.errors > 0) {
      std::fprintf(stderr, "keel_loadgen: warm-up failed %lld turns; first: %s\n",
                   static_cast<long long>(sh.errors), sh.first_error.c_str());
      co_return 1;
    }
  }

  StoreCounters before = co_await SumStoreCounters(io, o, endpoints);
  ThreadCpu cpu_before = ReadThreadCpu(o.server_pid);
  auto start = Clock::now();
  sh.last_done = start;
  co_await phase(o.duration_s, true);
  ThreadCpu cpu_after = ReadThreadCpu(o.server_pid);
  StoreCounters after = co_await SumStoreCounters(io, o, endpoints);

  double seconds = std::chrono::duration<double>(sh.last_done - start).count();
  int64_t turns = static_cast<int64_t>(sh.latencies_ns.size());
  double tps = seconds > 0 ? static_cast<double>(turns) / seconds : 0;
  double max_ms = sh.latencies_ns.empty()
                      ? 0
                      : static_cast<double>(*std::max_element(sh.latencies_ns.begin(),
                                                              sh.latencies_ns.end())) / 1e6;
  double mean_ms = 0;
  for (auto ns : sh.latencies_ns) mean_ms += static_cast<double>(ns) / 1e6;
  if (turns > 0) mean_ms /= static_cast<double>(turns);
  double commits = after.commits - before.commits;
  double units = after.units - before.units;
  // With --concurrency 1 --warmup 0 the latencies are one session's turns in order: the median of
  // its turns 6-25 and of its last twenty (how a turn's cost grows with the session's history;
  // twenty, as one turn in a hundred on a shared machine is slow for reasons of its own).
  // Taken, and written out, before the percentiles below reorder the latencies.
  auto median_ms = [](std::vector<int64_t> v) { return PercentileMs(v, 0.5); };
  const auto& lat = sh.latencies_ns;
  double early_ms = lat.size() >= 45 ? median_ms({lat.begin() + 5, lat.begin() + 25}) : 0;
  double late_ms = lat.size() >= 45 ? median_ms({lat.end() - 20, lat.end()}) : 0;
  if (!o.latencies_file.empty()) {
    std::ofstream out(o.latencies_file);
    for (auto ns : lat) out << static_cast<double>(ns) / 1e6 << "\n";
  }
  double p50 = PercentileMs(sh.latencies_ns, 0.50);
  double p99 = PercentileMs(sh.latencies_ns, 0.99);

  if (o.targets.size() > 1) std::printf("nodes %zu: ", o.targets.size());
  std::printf("concurrency %d: %lld turns in %.2f s = %.0f turns/s; latency p50 %.3f ms, "
              "p99 %.3f ms, max %.3f ms, mean %.3f ms; errors %lld\n",
              o.concurrency, static_cast<long long>(turns), seconds, tps, p50, p99, max_ms, mean_ms,
              static_cast<long long>(sh.errors));
  if (commits > 0) {
    std::printf("  store: %.0f commits, %.0f units (%.2f units/commit, %.2f units/turn, "
                "%.0f commits/s)\n",
                commits, units, units / commits, turns > 0 ? units / static_cast<double>(turns) : 0,
                seconds > 0 ? commits / seconds : 0);
  }
  double cpu_main_us = 0, cpu_other_us = 0;
  if (o.server_pid > 0 && turns > 0) {
    cpu_main_us = (cpu_after.main_s - cpu_before.main_s) * 1e6 / static_cast<double>(turns);
    cpu_other_us = (cpu_after.other_s - cpu_before.other_s) * 1e6 / static_cast<double>(turns);
    std::printf("  server CPU per turn: main (io) thread %.0f us, other threads (store writer) "
                "%.0f us; server CPU use %.0f%% of one core\n",
                cpu_main_us, cpu_other_us,
                seconds > 0 ? (cpu_main_us + cpu_other_us) * static_cast<double>(turns) / seconds / 1e4
                            : 0.0);
  }
  if (sh.errors > 0) std::printf("  first error: %s\n", sh.first_error.c_str());
  std::printf("RESULT nodes=%zu concurrency=%d turns=%lld seconds=%.3f turns_per_s=%.1f p50_ms=%.3f "
              "p99_ms=%.3f max_ms=%.3f mean_ms=%.3f errors=%lld commits=%.0f units=%.0f "
              "units_per_commit=%.2f cpu_main_us=%.0f cpu_other_us=%.0f early_ms=%.3f "
              "late_ms=%.3f\n",
              o.targets.size(), o.concurrency, static_cast<long long>(turns), seconds, tps, p50, p99, max_ms, mean_ms,
              static_cast<long long>(sh.errors), commits, units,
              commits > 0 ? units / commits : 0.0, cpu_main_us, cpu_other_us, early_ms, late_ms);
  std::fflush(stdout);
  co_return sh.errors > 0 || turns == 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = ParseArgs(argc, argv);
  asio::io_context io(1);
  int rc = 1;
  asio::co_spawn(io, Main(io, o), [&](std::exception_ptr e, int r) {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        std::fprintf(stderr, "keel_loadgen: %s\n", ex.what());
      }
      rc = 1;
    } else {
      rc = r;
    }
  });
  io.run();
  return rc;
}
