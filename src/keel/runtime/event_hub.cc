#include "keel/runtime/event_hub.h"

#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <algorithm>

namespace keel::runtime {

namespace asio = boost::asio;

class EventHub::Subscription {
 public:
  Subscription(asio::any_io_executor ex, SubscriptionFilter f) : filter(std::move(f)), timer(ex) {}
  bool Matches(const std::string& tenant, const std::string& agent, const std::string& session,
               const std::string& run) const {
    return tenant == filter.tenant_id && (filter.agent_id.empty() || agent == filter.agent_id) &&
           (filter.session_id.empty() || session == filter.session_id) &&
           (filter.run_id.empty() || run == filter.run_id);
  }
  void Wake() {
    pending = true;
    timer.cancel();
  }

  // Where EventHub::index_ holds it: the level and the filter field it is under.
  int level() const {
    return !filter.run_id.empty()       ? 0
           : !filter.session_id.empty() ? 1
           : !filter.agent_id.empty()   ? 2
                                        : 3;
  }
  const std::string& key() const {
    switch (level()) {
      case 0:
        return filter.run_id;
      case 1:
        return filter.session_id;
      case 2:
        return filter.agent_id;
      default:
        return filter.tenant_id;
    }
  }

  SubscriptionFilter filter;
  asio::steady_timer timer;
  std::list<SubscriptionPtr>::iterator self;  // in subs_, while subscribed
  bool subscribed = false;
  bool pending = false;  // a wake-up arrived that Wait has not consumed
  bool dirty = false;    // a matching event arrived
  std::deque<Delta> deltas;
  std::optional<store::Run> settled;  // see EventHub::Ending
  bool unsettled = false;             // the run may have changed past what its ending gives
  bool may_have_ended = false;        // see EventHub::TakeMayHaveEnded
};

EventHub::EventHub(asio::any_io_executor executor) : executor_(std::move(executor)) {}
EventHub::~EventHub() = default;

namespace {
// The most deltas a held run keeps (a subscriber keeps as many): a run's intake commits within
// milliseconds, so only a run whose commit failed comes near it.
constexpr size_t kMaxHeldDeltas = 10000;
// Events after which their run is still running.
bool Progress(const std::string& type) {
  for (const char* t :
       {"run.started@", "run.step@", "message.created@", "tool.call.started@",
        "tool.call.completed@", "tool.before@", "tool.after@", "session.compacted@"}) {
    if (type.starts_with(t)) return true;
  }
  return false;
}
// The event of a run's ending (runs::Finish).
bool EndsRun(const std::string& type) {
  return type.starts_with("run.completed@") || type.starts_with("run.failed@") ||
         type.starts_with("run.cancelled@");
}
}  // namespace

void EventHub::OnCommit(const std::vector<store::Event>& events) {
  std::vector<Committed> committed;
  committed.reserve(events.size());
  for (const auto& e : events) {
    committed.push_back({e.tenant_id, e.agent_id, e.session_id, e.run_id, e.position,
                         e.type.starts_with("run.cancel_requested@"), Progress(e.type)});
    if (EndsRun(e.type)) {
      std::lock_guard<std::mutex> lock(endings_mu_);
      auto it = endings_.find(e.run_id);
      if (it != endings_.end() && it->second->tenant_id == e.tenant_id) {
        committed.back().ending = std::move(it->second);
        endings_.erase(it);
      }
    }
  }
  asio::post(executor_, [this, committed = std::move(committed)] { Dispatch(committed); });
}

template <typename Fn>
void EventHub::ForEachMatch(const std::string& tenant, const std::string& agent,
                            const std::string& session, const std::string& run, Fn fn) {
  const std::string* keys[4] = {&run, &session, &agent, &tenant};
  for (int level = 0; level < 4; ++level) {
    if (keys[level]->empty()) continue;
    auto it = index_[level].find(*keys[level]);
    if (it == index_[level].end()) continue;
    for (Subscription* sub : it->second) {
      if (sub->Matches(tenant, agent, session, run)) fn(*sub);
    }
  }
}

void EventHub::Dispatch(const std::vector<Committed>& events) {
  for (const auto& e : events) {
    int64_t& last = last_position_[e.tenant_id];
    last = std::max(last, e.position);
  }
  for (const auto& e : events) {
    ForEachMatch(e.tenant_id, e.agent_id, e.session_id, e.run_id, [&](Subscription& sub) {
      sub.dirty = true;
      if (e.cancel_request) sub.unsettled = true;
      if (!e.progress) sub.may_have_ended = true;
      if (e.ending && sub.filter.run_id == e.run_id) sub.settled = *e.ending;
      sub.Wake();
    });
  }
  if (held_.empty()) return;
  for (const auto& e : events) {
    auto it = held_.find(e.run_id);
    if (e.run_id.empty() || it == held_.end()) continue;
    std::vector<Delta> waiting = std::move(it->second);
    held_.erase(it);
    // Each unit's events come in a Dispatch of their own: these are intake's, so the deltas go
    // after them (PublishDelta stamps the position just seen) and before the run's ending.
    for (const Delta& d : waiting) PublishDelta(d);
  }
}

void EventHub::OnRemoteCommit() {
  asio::post(executor_, [this] {
    for (auto& sub : subs_) {
      sub->dirty = true;
      sub->unsettled = true;
      sub->may_have_ended = true;
      sub->Wake();
    }
  });
}

void EventHub::HoldDeltas(const std::string& run_id) { held_.try_emplace(run_id); }

void EventHub::DropHeld(const std::string& run_id) { held_.erase(run_id); }

void EventHub::PublishDelta(const Delta& delta) {
  if (!held_.empty()) {
    auto it = held_.find(delta.run_id);
    if (it != held_.end()) {
      if (it->second.size() < kMaxHeldDeltas) it->second.push_back(delta);
      return;
    }
  }
  Delta d = delta;
  auto last = last_position_.find(d.tenant_id);
  d.after_position = last == last_position_.end() ? 0 : last->second;
  ForEachMatch(d.tenant_id, d.agent_id, d.session_id, d.run_id, [&](Subscription& sub) {
    if (!sub.filter.deltas) return;
    if (sub.deltas.size() < 10000) sub.deltas.push_back(d);
    sub.Wake();
  });
}

EventHub::SubscriptionPtr EventHub::Subscribe(const SubscriptionFilter& filter) {
  auto sub = std::make_shared<Subscription>(executor_, filter);
  sub->self = subs_.insert(subs_.end(), sub);
  sub->subscribed = true;
  index_[sub->level()][sub->key()].push_back(sub.get());
  return sub;
}

void EventHub::Unsubscribe(const SubscriptionPtr& sub) {
  if (!sub || !sub->subscribed) return;
  sub->subscribed = false;
  auto& index = index_[sub->level()];
  auto it = index.find(sub->key());
  if (it != index.end()) {
    std::erase(it->second, sub.get());
    if (it->second.empty()) index.erase(it);
  }
  subs_.erase(sub->self);
}

void EventHub::Close() {
  closing_ = true;
  for (auto& sub : subs_) sub->Wake();
}

asio::awaitable<void> EventHub::Wait(const SubscriptionPtr& sub,
                                     std::chrono::milliseconds timeout) {
  if (sub->pending || closing_) {
    sub->pending = false;
    co_return;
  }
  sub->timer.expires_after(timeout);
  boost::system::error_code ec;
  co_await sub->timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
  sub->pending = false;
}

std::deque<Delta> EventHub::TakeDeltas(const SubscriptionPtr& sub) {
  return std::exchange(sub->deltas, {});
}

bool EventHub::TakeDirty(const SubscriptionPtr& sub) { return std::exchange(sub->dirty, false); }

void EventHub::Ending(const store::Run& run) {
  auto copy = std::make_shared<const store::Run>(run);
  std::lock_guard<std::mutex> lock(endings_mu_);
  endings_[run.id] = std::move(copy);
}

void EventHub::ForgetEnding(const std::string& run_id) {
  std::lock_guard<std::mutex> lock(endings_mu_);
  endings_.erase(run_id);
}

std::optional<store::Run> EventHub::TakeSettled(const SubscriptionPtr& sub) {
  std::optional<store::Run> out = std::exchange(sub->settled, std::nullopt);
  if (sub->unsettled) return std::nullopt;
  return out;
}

bool EventHub::TakeMayHaveEnded(const SubscriptionPtr& sub) {
  return std::exchange(sub->may_have_ended, false);
}

}  // namespace keel::runtime
