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

  SubscriptionFilter filter;
  asio::steady_timer timer;
  bool pending = false;  // a wake-up arrived that Wait has not consumed
  bool dirty = false;    // a matching event arrived
  std::deque<Delta> deltas;
};

EventHub::EventHub(asio::any_io_executor executor) : executor_(std::move(executor)) {}
EventHub::~EventHub() = default;

void EventHub::OnCommit(const std::vector<store::Event>& events) {
  std::vector<Committed> committed;
  committed.reserve(events.size());
  for (const auto& e : events) {
    committed.push_back({e.tenant_id, e.agent_id, e.session_id, e.run_id, e.position});
  }
  asio::post(executor_, [this, committed = std::move(committed)] { Dispatch(committed); });
}

void EventHub::Dispatch(const std::vector<Committed>& events) {
  for (const auto& e : events) {
    int64_t& last = last_position_[e.tenant_id];
    last = std::max(last, e.position);
  }
  for (auto& sub : subs_) {
    for (const auto& e : events) {
      if (sub->Matches(e.tenant_id, e.agent_id, e.session_id, e.run_id)) {
        sub->dirty = true;
        sub->Wake();
        break;
      }
    }
  }
}

void EventHub::OnRemoteCommit() {
  asio::post(executor_, [this] {
    for (auto& sub : subs_) {
      sub->dirty = true;
      sub->Wake();
    }
  });
}

void EventHub::PublishDelta(const Delta& delta) {
  Delta d = delta;
  auto last = last_position_.find(d.tenant_id);
  d.after_position = last == last_position_.end() ? 0 : last->second;
  for (auto& sub : subs_) {
    if (sub->filter.deltas && sub->Matches(d.tenant_id, d.agent_id, d.session_id, d.run_id)) {
      if (sub->deltas.size() < 10000) sub->deltas.push_back(d);
      sub->Wake();
    }
  }
}

EventHub::SubscriptionPtr EventHub::Subscribe(const SubscriptionFilter& filter) {
  auto sub = std::make_shared<Subscription>(executor_, filter);
  subs_.push_back(sub);
  return sub;
}

void EventHub::Unsubscribe(const SubscriptionPtr& sub) { subs_.remove(sub); }

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

}  // namespace keel::runtime
