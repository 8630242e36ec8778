#pragma once
// plugins::EventBus — one per running agent, never shared between agents: the handlers its
// enabled plugins registered, by event type. Emitting runs them in order (lower priority first,
// ties in registration order), across the versions of the family: the runtime emits the newest
// payload and a handler of an older version gets it converted down (catalog.h).
//
// Shapes: listeners only look; transforms hand their result to the next handler and finally to
// the runtime; vetoes allow or deny, and the first deny ends the emission. A handler that fails
// (throws, errs, runs out of its budget) is skipped and reported in Emitted::errors, unless its
// plugin said failure_mode "fail": then Emitted::abort says the turn must stop.
//
// Handlers are awaited one after another: a Lua handler waiting on a ctx.memory read suspends
// the emission without holding the event loop (other coroutines run meanwhile), and the next
// handler runs once it has answered.
//
// Not thread-safe: used on the event loop only. Handlers must be quick (Lua handlers run under
// their budgets; slow work belongs in a webhook plugin). The bus must outlive each emission
// (callers hold the AgentPlugins it belongs to).

#include <boost/asio/awaitable.hpp>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"

namespace keel::plugins {

// A listener's value is ignored; a transform returns the new payload, or Unchanged() when it
// changes nothing (no copy is made then); a veto returns {"allow": bool, "reason": text}.
// `payload` stays valid until the handler completes.
using HookFn = std::function<boost::asio::awaitable<Result<Json>>(const Json& payload)>;

// What a transform returns to keep the payload as it came (a discarded value, which no plugin's
// JSON can be).
Json Unchanged();

// A handler that answers at once (the built-ins), as a HookFn.
HookFn Immediate(std::function<Result<Json>(const Json& payload)> fn);

struct HookOptions {
  std::string plugin_id;
  int priority = 100;
  bool fail_turn = false;  // the plugin's failure_mode is "fail"
};

struct PluginError {
  std::string plugin_id;
  std::string event;    // "tool.before@v1"
  std::string message;
};

struct Emitted {
  Json payload;  // after every transform (transform events); the input otherwise
  bool changed = false;    // a transform returned a payload other than Unchanged()
  bool denied = false;     // veto events: a handler denied
  std::string reason;      // ... and why
  std::string denied_by;   // ... which plugin
  std::vector<PluginError> errors;  // handlers skipped because they failed
  std::optional<PluginError> abort; // a failure_mode "fail" handler failed: stop the turn
};

class EventBus {
 public:
  // Adds a handler for "family@vN". kInvalidArgument for a type not in the catalog.
  Status On(std::string_view event, HookFn fn, HookOptions options);

  // Whether any handler listens to a version of `family` (to skip building payloads).
  bool Has(std::string_view family) const;

  // Emits `family` with the payload of its newest version. REQUIRES: the bus outlives it;
  // `family` stays valid until it completes.
  boost::asio::awaitable<Emitted> Emit(std::string_view family, Json payload) const;

  size_t size() const { return hooks_.size(); }

 private:
  struct Hook {
    std::string family;
    int version;
    HookFn fn;
    HookOptions options;
    size_t seq;
  };
  std::vector<Hook> hooks_;  // sorted by (priority, seq)
};

}  // namespace keel::plugins
