#pragma once
// Internal to the api module: waiting for a run a request posted (api_sessions.cc).

#include <boost/asio/awaitable.hpp>

#include "keel/api/api.h"
#include "keel/common/status.h"
#include "keel/store/types.h"

namespace keel::api {

// Suspends until the run is terminal, or waiting for approval (unless `through_approval`: then
// it waits on through the decision), or `seconds` pass; returns the run as it then stands.
// `just_claimed`: intake claimed the run for this node just now (not a replay).
boost::asio::awaitable<Result<store::Run>> WaitForRun(ApiContext& ctx, store::Run current,
                                                      double seconds, bool just_claimed,
                                                      bool through_approval = false);

}  // namespace keel::api
