// keel_populate: fills a KEEL_HOME's store with many agents and sessions through the Store
// interface, so that `keel serve --home DIR` can then be started on it (for the memory
// benchmark: resident size of a server holding a large store).
//
//   keel_populate --home DIR [--agents 100000] [--sessions 1000000] [--batch 1000] [--no-events]
//
// - Writes DIR/origin (the node's origin id, which keel serve reuses) unless present.
// - Creates the default tenant and an owner token when the store has no tenant yet, with a
//   secret of our own; DIR/owner.token holds it (the server stores only sha256hex(secret)).
// - Inserts the agents (model "local") and the sessions (spread round-robin over the agents),
//   each with the event the API would append (agent.created@v1, session.created@v1) unless
//   --no-events, in units of `--batch` records, one WriteSync (one commit) per unit.
// Prints one line: POPULATED agents=... sessions=... events=... seconds=... rows_per_s=...
//   first_agent=ID db_bytes=...

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/common/time.h"
#include "keel/store/store.h"

namespace fs = std::filesystem;
using keel::Status;
namespace store = keel::store;

namespace {

[[noreturn]] void Die(const std::string& msg) {
  std::fprintf(stderr, "keel_populate: %s\n", msg.c_str());
  std::exit(1);
}

void WriteFile0600(const std::string& path, const std::string& content) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || ::write(fd, content.data(), content.size()) != static_cast<ssize_t>(content.size())) {
    Die("cannot write " + path);
  }
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  std::string home;
  int64_t n_agents = 100000, n_sessions = 1000000, batch = 1000;
  bool events = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) Die("missing value for " + a);
      return argv[++i];
    };
    if (a == "--home") home = next();
    else if (a == "--agents") n_agents = std::stoll(next());
    else if (a == "--sessions") n_sessions = std::stoll(next());
    else if (a == "--batch") batch = std::stoll(next());
    else if (a == "--no-events") events = false;
    else Die("unknown argument " + a +
             " (usage: keel_populate --home DIR [--agents N] [--sessions N] [--batch N] [--no-events])");
  }
  if (home.empty()) Die("--home DIR is required");
  if (n_agents < 1 || batch < 1) Die("--agents and --batch must be >= 1");
  std::error_code ec;
  fs::create_directories(home, ec);
  if (ec) Die("cannot create " + home + ": " + ec.message());
  ::chmod(home.c_str(), 0700);

  // The origin keel serve will use for this home (it reads DIR/origin when present).
  std::string origin;
  {
    std::ifstream in(home + "/origin");
    if (!in || !std::getline(in, origin) || origin.empty()) {
      origin = keel::NewId();
      WriteFile0600(home + "/origin", origin + "\n");
    }
  }
  store::StoreOptions options;
  options.origin = origin;
  options.sync_full = true;
  auto opened = store::OpenStore("sqlite://" + home + "/keel.db", options);
  if (!opened.ok()) Die(opened.status().message());
  std::unique_ptr<store::Store> st = std::move(opened).value();

  // The tenant: the existing first one, or a new default tenant with our own owner token.
  std::string tenant_id;
  Status s = st->Read([&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto tenants, tx.tenants().ListTenants());
    if (!tenants.empty()) tenant_id = tenants.front().id;
    return Status::Ok();
  });
  if (!s.ok()) Die(s.message());
  if (tenant_id.empty()) {
    store::Tenant tenant{keel::NewId(), "default", keel::NowMillis()};
    std::string secret = keel::NewToken();
    store::Token token;
    token.id = keel::NewId();
    token.tenant_id = tenant.id;
    token.name = "owner";
    token.role = "owner";
    token.hash = keel::Sha256Hex(secret);
    token.created_at = tenant.created_at;
    s = st->WriteSync([&](store::Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant(tenant));
      KEEL_RETURN_IF_ERROR(tx.tokens().InsertToken(token));
      return tx.events()
          .Append({tenant.id, "tenant.created@v1", "", "", "",
                   {{"tenant_id", tenant.id}, {"name", tenant.name}}});
    });
    if (!s.ok()) Die(s.message());
    WriteFile0600(home + "/owner.token", secret + "\n");
    tenant_id = tenant.id;
  }

  const auto t0 = std::chrono::steady_clock::now();
  const keel::Json tools = keel::Json::array({"time.now"});
  const std::string run_tag = keel::NewId().substr(24);  // keeps names unique across re-runs
  std::vector<std::string> agent_ids;
  agent_ids.reserve(static_cast<size_t>(n_agents));
  int64_t n_events = 0;

  for (int64_t done = 0; done < n_agents;) {
    const int64_t n = std::min(batch, n_agents - done);
    std::vector<store::Agent> unit(static_cast<size_t>(n));
    const keel::Millis now = keel::NowMillis();
    for (int64_t i = 0; i < n; ++i) {
      store::Agent& a = unit[static_cast<size_t>(i)];
      a.id = keel::NewId();
      a.tenant_id = tenant_id;
      a.name = "agent-" + run_tag + "-" + std::to_string(done + i);
      a.model = "local";
      a.instructions = "You are a benchmark agent on the built-in local model.";
      a.tools = tools;
      a.created_at = a.updated_at = now;
    }
    s = st->WriteSync([&](store::Tx& tx) -> Status {
      for (const auto& a : unit) {
        KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(a));
        if (events) {
          KEEL_RETURN_IF_ERROR(tx.events()
                                   .Append({tenant_id, "agent.created@v1", a.id, "", "",
                                            {{"name", a.name}, {"model", a.model}}}));
        }
      }
      return Status::Ok();
    });
    if (!s.ok()) Die("inserting agents: " + s.message());
    for (auto& a : unit) agent_ids.push_back(std::move(a.id));
    if (events) n_events += n;
    done += n;
  }

  for (int64_t done = 0; done < n_sessions;) {
    const int64_t n = std::min(batch, n_sessions - done);
    std::vector<store::Session> unit(static_cast<size_t>(n));
    const keel::Millis now = keel::NowMillis();
    for (int64_t i = 0; i < n; ++i) {
      store::Session& x = unit[static_cast<size_t>(i)];
      x.id = keel::NewId();
      x.tenant_id = tenant_id;
      x.agent_id = agent_ids[static_cast<size_t>((done + i) % n_agents)];
      x.title = "session " + std::to_string(done + i);
      x.created_at = x.updated_at = now;
    }
    s = st->WriteSync([&](store::Tx& tx) -> Status {
      for (const auto& x : unit) {
        KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(x));
        if (events) {
          KEEL_RETURN_IF_ERROR(tx.events()
                                   .Append({tenant_id, "session.created@v1", x.agent_id, x.id, "",
                                            {{"title", x.title}}}));
        }
      }
      return Status::Ok();
    });
    if (!s.ok()) Die("inserting sessions: " + s.message());
    if (events) n_events += n;
    done += n;
  }
  st->Close();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  uintmax_t db_bytes = 0;
  for (const char* f : {"/keel.db", "/keel.db-wal"}) {
    auto sz = fs::file_size(home + f, ec);
    if (!ec) db_bytes += sz;
  }
  const int64_t rows = n_agents + n_sessions + n_events;
  std::printf("POPULATED agents=%lld sessions=%lld events=%lld seconds=%.2f rows_per_s=%.0f "
              "first_agent=%s tenant=%s db_bytes=%llu\n",
              static_cast<long long>(n_agents), static_cast<long long>(n_sessions),
              static_cast<long long>(n_events), secs, secs > 0 ? static_cast<double>(rows) / secs : 0,
              agent_ids.front().c_str(), tenant_id.c_str(), static_cast<unsigned long long>(db_bytes));
  return 0;
}
