#include "keel/runtime/runtime.h"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>
#include <vector>

#include "keel/approvals/approvals.h"
#include "keel/common/log.h"
#include "keel/common/time.h"
#include "keel/http/client.h"
#include "keel/memory/memory.h"
#include "keel/metrics.h"
#include "keel/plugins/lua_plugin.h"
#include "keel/plugins/host.h"
#include "keel/runtime/event_hub.h"
#include "keel/store/async.h"

namespace keel::runtime {

namespace asio = boost::asio;

namespace {

// ctx.memory for an agent's Lua plugins: synchronous reads of that agent's memories (the plugin
// runs on the event loop, in the turn).
plugins::MemoryReaders MemoryReadersOn(store::Store& store) {
  return [&store](const std::string& tenant_id, const std::string& agent_id) {
    plugins::MemoryReader reader;
    reader.search = [&store, tenant_id, agent_id](const std::string& query,
                                                   const std::string& tag, int limit) {
      return memory::SearchJson(store, tenant_id, agent_id, query, tag, limit);
    };
    reader.get = [&store, tenant_id, agent_id](const std::string& id) {
      return memory::GetJson(store, tenant_id, agent_id, id);
    };
    return reader;
  };
}

}  // namespace

Runtime::Runtime(asio::any_io_executor executor, store::Store& store, EventHub& hub,
                 model::ProviderRegistry& providers, tools::Gateway& gateway, Metrics& metrics,
                 RuntimeOptions options, const secrets::Vault* vault)
    : executor_(executor),
      store_(store),
      hub_(hub),
      providers_(providers),
      gateway_(gateway),
      metrics_(metrics),
      options_(options),
      wake_timer_(executor),
      slots_(options.max_concurrent_runs,
             std::clamp(options.tenant_max_running, 1, options.max_concurrent_runs)),
      plugins_(std::make_unique<plugins::PluginHost>(options.audit_dir, MemoryReadersOn(store))),
      vault_(vault),
      webhook_client_(std::make_unique<http::Client>([&] {
        http::Client::Options o;
        o.outbound = options.outbound;
        return o;
      }())),
      delivery_timer_(executor),
      schedule_timer_(executor) {
  HookGateway();
}

Runtime::~Runtime() = default;

Status Runtime::Start() {
  // Whatever this origin was running before a restart belongs to a dead process: make it
  // claimable now rather than after its lease would have run out.
  std::string origin = store_.origin();
  KEEL_RETURN_IF_ERROR(store_.WriteSync(
      [origin](store::Tx& tx) { return tx.runs().ExpireLeasesOf(origin); }));
  asio::co_spawn(executor_, DispatchLoop(), ReportExceptions{"run dispatcher"});
  asio::co_spawn(executor_, LeaseLoop(), ReportExceptions{"lease keeper"});
  asio::co_spawn(executor_, ApprovalExpiryLoop(), ReportExceptions{"approval expiry"});
  asio::co_spawn(executor_, DeliveryLoop(), ReportExceptions{"webhook deliveries"});
  asio::co_spawn(executor_, ScheduleLoop(), ReportExceptions{"schedules"});
  asio::co_spawn(executor_, CachePruneLoop(), ReportExceptions{"response cache pruning"});
  asio::co_spawn(executor_, IntrospectionLoop(), ReportExceptions{"idle introspection"});
  return Status::Ok();
}

void Runtime::Wake() {
  wake_pending_ = true;
  wake_timer_.cancel();
}

asio::awaitable<void> Runtime::DispatchLoop() {
  while (!draining_) {
    if (!wake_pending_) {
      // Poll now and then: a lease may expire without anyone waking us.
      wake_timer_.expires_after(std::chrono::milliseconds(500));
      boost::system::error_code ec;
      co_await wake_timer_.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    wake_pending_ = false;
    if (draining_) break;
    if (slots_.free() <= 0) continue;
    std::vector<store::Run> runs;
    Millis now = NowMillis();
    // ClaimableRuns takes the tenants in turn (each one's oldest first, then each one's second,
    // ...), so a tenant with a long queue does not crowd the others out of this page.
    int want = options_.max_concurrent_runs;
    Status st = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(runs, tx.runs().ClaimableRuns(now, want));
      return Status::Ok();
    });
    if (!st.ok()) continue;
    for (auto& run : runs) {
      if (slots_.free() <= 0) break;
      if (executing_.count(run.id)) continue;
      // A tenant at its share: its run stays queued, and the next tenant's is looked at.
      RunSlots::Hold slot = slots_.Take(run.tenant_id);
      if (!slot) continue;
      Launch(std::move(run), std::nullopt, std::move(slot));
    }
  }
}

void Runtime::Launch(store::Run run, std::optional<Known> known, RunSlots::Hold slot) {
  executing_.insert(run.id);
  asio::co_spawn(executor_, RunOne(std::move(run), std::move(known), std::move(slot)),
                 ReportExceptions{"run execution"});
}

asio::awaitable<void> Runtime::LeaseLoop() {
  asio::steady_timer timer(executor_);
  while (!draining_) {
    timer.expires_after(std::chrono::milliseconds(std::max(100, options_.lease_ms / 3)));
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (executing_.empty()) continue;
    std::vector<std::string> ids(executing_.begin(), executing_.end());
    std::string origin = store_.origin();
    Millis until = NowMillis() + options_.lease_ms;
    (void)co_await store::AsyncWrite(store_, [&](store::Tx& tx) {
      return tx.runs().RenewLeases(origin, ids, until);
    });
  }
}

asio::awaitable<void> Runtime::ApprovalExpiryLoop() {
  asio::steady_timer timer(executor_);
  while (!draining_) {
    timer.expires_after(std::chrono::seconds(1));
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    if (draining_ || !store_.leader()) continue;  // one node sweeps; Decide is safe anyway
    std::vector<store::Approval> expired;
    Millis now = NowMillis();
    Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(expired, tx.approvals().ExpiredApprovals(now, 100));
      return Status::Ok();
    });
    if (!read.ok() || expired.empty()) continue;
    bool requeued = false;
    for (const auto& a : expired) {
      approvals::DecisionRequest d;
      d.tenant_id = a.tenant_id;
      d.approval_id = a.id;
      d.verdict = approvals::Verdict::kExpire;
      d.decided_by = "system";
      d.reason = "no decision before " + FormatRfc3339(a.expires_at);
      // A named function object: g++ 12 mis-destroys a capturing lambda temporary inside a
      // co_await expression (freed twice).
      store::WriteFn decide = [d, now](store::Tx& tx) -> Status {
        return approvals::Decide(tx, d, now).status();
      };
      auto written = co_await store::AsyncWrite(store_, std::move(decide));
      // kConflict: decided meanwhile (by a human or another node); nothing to do.
      if (written.ok()) requeued = true;
    }
    if (requeued) Wake();
  }
}

asio::awaitable<void> Runtime::Drain(std::chrono::milliseconds grace) {
  draining_ = true;
  wake_timer_.cancel();
  delivery_timer_.cancel();
  schedule_timer_.cancel();
  asio::steady_timer timer(executor_);
  auto deadline = std::chrono::steady_clock::now() + grace;
  while (!executing_.empty() && std::chrono::steady_clock::now() < deadline) {
    timer.expires_after(std::chrono::milliseconds(20));
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  }
  for (const auto& p : plugins_->All()) ForgetAgent(p->agent_id);
}

}  // namespace keel::runtime
