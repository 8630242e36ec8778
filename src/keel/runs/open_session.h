#pragma once
// Opening a session: its row, the row's image and `session.created@v1`, in the caller's unit of
// work. Every way a session opens (the API, the OpenAI-compatible front door, an MCP client's
// initialize, a schedule's firing) goes through here, so that they write the same.

#include <string_view>

#include "keel/common/status.h"
#include "keel/store/types.h"

namespace keel::store {
class Tx;
}

namespace keel::runs {

// `via` names the door when it is not the API's own ("mcp"); the event carries it.
// REQUIRES: the session's agent exists in the unit (the caller read it).
Status OpenSession(store::Tx& tx, const store::Session& session, std::string_view via = "");

}  // namespace keel::runs
