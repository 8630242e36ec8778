#pragma once
// EventHub: wakes live readers (SSE streams, ?wait= requests) when events commit, and carries
// token deltas, which are never stored. The event log stays the truth: a subscriber re-reads
// the store after each wake-up, so a missed wake-up costs latency, never an event.
//
// Lives on the server's io executor: Subscribe/Wait/PublishDelta run there. OnCommit may be
// called from any thread (the store's writer) and posts to the executor; so may OnRemoteCommit
// (the store's notification listener: another node committed).

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/store/types.h"

namespace keel::runtime {

struct Delta {
  std::string tenant_id;
  std::string agent_id;
  std::string session_id;
  std::string run_id;
  std::string text;
  // The highest position of its tenant's events the hub had seen when the delta was published:
  // a stream writes the delta after the events up to here and before later ones.
  int64_t after_position = 0;
};

struct SubscriptionFilter {
  std::string tenant_id;  // required
  std::string agent_id;   // empty = any
  std::string session_id;
  std::string run_id;
  bool deltas = true;  // false: wake only for committed events
};

class EventHub {
 public:
  class Subscription;
  using SubscriptionPtr = std::shared_ptr<Subscription>;  // shared with the hub's wake list

  explicit EventHub(boost::asio::any_io_executor executor);
  ~EventHub();

  // Called with every committed unit's events (from the store's writer thread). Only what
  // routing needs crosses to the io thread, not the payloads: streams read events from the store.
  void OnCommit(const std::vector<store::Event>& events);
  // Called (from any thread) when another node may have committed events: wakes every
  // subscription as if a matching event had committed; each re-reads the store.
  void OnRemoteCommit();
  void PublishDelta(const Delta& delta);
  // A run whose intake was told before it committed (Store::WriteDeferred): its deltas wait
  // here until the run's first committed event, which publishes them after it, so that no
  // stream sees a run before it is on disk. DropHeld forgets what still waits (the run ended
  // and its intake never committed).
  void HoldDeltas(const std::string& run_id);
  void DropHeld(const std::string& run_id);

  SubscriptionPtr Subscribe(const SubscriptionFilter& filter);
  void Unsubscribe(const SubscriptionPtr& sub);
  // Suspends until a matching event commits or a delta arrives, or `timeout` passes.
  boost::asio::awaitable<void> Wait(const SubscriptionPtr& sub, std::chrono::milliseconds timeout);
  // Deltas received since the last call.
  std::deque<Delta> TakeDeltas(const SubscriptionPtr& sub);
  // Whether a matching event committed since the last call (clears the flag).
  bool TakeDirty(const SubscriptionPtr& sub);
  // The run as the unit ending it writes it, from that unit (on the store's writer thread):
  // when the unit commits, the ending's event hands it to the run's subscriptions (filter.run_id)
  // with their wake-up, so that a waiter need not read the run back. The executor forgets it
  // once its write returned (ForgetEnding), whether the unit committed or not.
  void Ending(const store::Run& run);
  void ForgetEnding(const std::string& run_id);
  // The run an ending handed this subscription, unless something may have changed the run since
  // without this node's execution knowing (a cancel request, another node's commit): then the
  // caller reads the run. Clears it.
  std::optional<store::Run> TakeSettled(const SubscriptionPtr& sub);
  // Whether, since the last call, a matching event that may have ended or parked its run
  // committed (anything but a run's progress: its claim, steps, messages and tool calls), or
  // another node committed. Clears it.
  bool TakeMayHaveEnded(const SubscriptionPtr& sub);

  size_t subscriber_count() const { return subs_.size(); }

  // The node stops: wakes every subscription for good; streams end and their clients reconnect.
  void Close();
  bool closing() const { return closing_; }

 private:
  // What Dispatch needs of a committed event.
  struct Committed {
    std::string tenant_id, agent_id, session_id, run_id;
    int64_t position = 0;
    bool cancel_request = false;  // run.cancel_requested: a settled run may not show it
    bool progress = false;        // a running run's progress (TakeMayHaveEnded)
    std::shared_ptr<const store::Run> ending;  // see Ending
  };
  void Dispatch(const std::vector<Committed>& events);
  // Calls `fn` with each subscription whose filter matches the four fields, looking only at those
  // indexed under one of them (not at every subscription: a commit costs the same with 1,000
  // streams open as with one).
  template <typename Fn>
  void ForEachMatch(const std::string& tenant, const std::string& agent, const std::string& session,
                    const std::string& run, Fn fn);
  boost::asio::any_io_executor executor_;
  std::list<SubscriptionPtr> subs_;
  // Each subscription under its most specific filter field: [0] its run, else [1] its session,
  // else [2] its agent, else [3] its tenant.
  std::unordered_map<std::string, std::vector<Subscription*>> index_[4];
  // Each tenant's highest event position seen (positions are per tenant).
  std::unordered_map<std::string, int64_t> last_position_;
  bool closing_ = false;
  // HoldDeltas' runs and their deltas, in order (at most kMaxHeldDeltas each).
  std::unordered_map<std::string, std::vector<Delta>> held_;
  std::mutex endings_mu_;  // Ending runs on the writer thread, ForgetEnding on the io thread
  std::unordered_map<std::string, std::shared_ptr<const store::Run>> endings_;
};

}  // namespace keel::runtime
