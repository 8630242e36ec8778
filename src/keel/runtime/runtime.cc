#include "keel/runtime/runtime.h"

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <vector>

#include "keel/approvals/approvals.h"
#include "keel/common/log.h"
#include "keel/common/time.h"
#include "keel/metrics.h"
#include "keel/runs/run_state.h"
#include "keel/runtime/crash_note.h"
#include "keel/runtime/event_hub.h"
#include "keel/runtime/model_calls.h"
#include "keel/runtime/plugin_bridge.h"
#include "keel/store/async.h"

namespace keel::runtime {

namespace asio = boost::asio;

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
      dispatcher_(std::make_unique<Dispatcher>(
          executor, store,
          Dispatcher::Options{options.max_concurrent_runs, options.tenant_max_running,
                              options.lease_ms},
          [this](store::Run run, std::optional<KnownRun> known, RunSlots::Hold slot) {
            return RunOne(std::move(run), std::move(known), std::move(slot));
          })),
      plugins_(std::make_unique<PluginBridge>(executor, store, gateway, options.audit_dir,
                                              options.outbound, vault)),
      models_(std::make_unique<ModelCaller>(executor, store, providers, metrics, options.prices,
                                            options.cache)),
      intake_(std::make_unique<Intake>(store, *dispatcher_, hub, *plugins_, settings_,
                                       options.lease_ms, options.tenant_run_cap)),
      schedule_timer_(executor) {}

Runtime::~Runtime() = default;

Status Runtime::Start() {
  if (!options_.crash_note.empty()) {
    // The runs a crash of this node stopped (before their leases are expired below), and the
    // handlers that note the next one.
    if (auto note = crash_note::Read(options_.crash_note)) {
      KEEL_RETURN_IF_ERROR(store_.WriteSync([&](store::Tx& tx) -> Status {
        for (const auto& r : note->runs) {
          KEEL_RETURN_IF_ERROR(
              runs::RecordCrash(tx, r.tenant_id, r.run_id, r.attempt, note->signal));
        }
        return Status::Ok();
      }));
      LogError("the last process stopped on signal " + std::to_string(note->signal) + " with " +
               std::to_string(note->runs.size()) + " run(s) executing; each is noted as crashed " +
               "(run.crashed@v1)");
      crash_note::Discard(options_.crash_note);
    }
    crash_note::Install(options_.crash_note);
  }
  KEEL_RETURN_IF_ERROR(dispatcher_->Start());
  asio::co_spawn(executor_, ApprovalExpiryLoop(), ReportExceptions{"approval expiry"});
  plugins_->Start();
  asio::co_spawn(executor_, ScheduleLoop(), ReportExceptions{"schedules"});
  models_->Start();
  asio::co_spawn(executor_, IntrospectionLoop(), ReportExceptions{"idle introspection"});
  return Status::Ok();
}

void Runtime::Wake() { dispatcher_->Wake(); }

asio::awaitable<Result<IntakeResult>> Runtime::PostMessage(const IntakeRequest& request) {
  return intake_->PostMessage(request);
}

asio::awaitable<Result<store::Run>> Runtime::Cancel(const std::string& tenant_id,
                                                    const std::string& run_id) {
  return intake_->Cancel(tenant_id, run_id);
}

asio::awaitable<void> Runtime::ApprovalExpiryLoop() {
  asio::steady_timer timer(executor_);
  while (!dispatcher_->draining()) {
    timer.expires_after(std::chrono::seconds(1));
    boost::system::error_code ec;
    co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    // One node sweeps; Decide is safe anyway.
    if (dispatcher_->draining() || !store_.leader()) continue;
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

bool Runtime::draining() const { return dispatcher_->draining(); }

asio::awaitable<void> Runtime::Drain(std::chrono::milliseconds grace) {
  // Each part stops taking new work at once; the executing runs then have their grace; the
  // agents' plugins stop last.
  hub_.Close();
  store_.Resign();
  schedule_timer_.cancel();
  models_->Stop();
  plugins_->StopDeliveries();
  co_await dispatcher_->Drain(grace);
  co_await plugins_->StopAgents();
}

asio::awaitable<Result<std::shared_ptr<plugins::AgentPlugins>>> Runtime::PluginsOf(
    std::string tenant_id, std::string agent_id) {
  return plugins_->PluginsOf(std::move(tenant_id), std::move(agent_id));
}

asio::awaitable<void> Runtime::EmitFor(std::string tenant_id, std::string agent_id,
                                       std::string family, Json payload) {
  return plugins_->EmitFor(std::move(tenant_id), std::move(agent_id), std::move(family),
                           std::move(payload));
}

asio::awaitable<Result<std::optional<std::string>>> Runtime::ChannelMessage(
    std::string family, std::string tenant_id, std::string agent_id, Json payload,
    std::optional<std::vector<store::PluginStamp>> stamps) {
  return plugins_->ChannelMessage(std::move(family), std::move(tenant_id), std::move(agent_id),
                                  std::move(payload), std::move(stamps));
}

asio::awaitable<void> Runtime::ForgetAgent(std::string agent_id) {
  return plugins_->ForgetAgent(std::move(agent_id));
}

void Runtime::WakeDeliveries() { plugins_->WakeDeliveries(); }

void Runtime::SetEndingWork(std::function<EndingWork(const store::Run&)> ask) {
  ending_work_ = std::move(ask);
}

}  // namespace keel::runtime
