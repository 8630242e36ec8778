#pragma once
// Introspection (docs/CONTEXT.md): runs of their own in a session, on their own triggers, that
// keep the session's description and the agent's memories (the working memory and the
// long-term memories are memory_store.h's). The storage port for what is introspection's own:
// the description (a column of sessions, Session::description) and the idle triggers.

#include <string>
#include <vector>

#include "keel/common/status.h"
#include "keel/store/types.h"

namespace keel::store {

// A session's idle introspection, due at `due_at` unless a later turn moves it.
struct IntrospectionDue {
  std::string tenant_id;
  std::string session_id;
  std::string agent_id;
  Millis due_at = 0;
};

class IntrospectionStore {
 public:
  virtual ~IntrospectionStore() = default;
  // Sets the session's description and updated_at. kNotFound "session not found: ID".
  virtual Status SetSessionDescription(const std::string& tenant_id, const std::string& session_id,
                                       const std::string& description, Millis at) = 0;
  // The session's `user` messages committed after its last `introspection` message (all of them
  // when it has none).
  virtual Result<int64_t> TurnsSinceIntrospection(const std::string& tenant_id,
                                                  const std::string& session_id) = 0;
  // Inserts or replaces the session's idle introspection.
  virtual Status PutIntrospectionDue(const IntrospectionDue& d) = 0;
  // Removes the session's idle introspection if it is still due at `due_at` (a later turn may
  // have moved it); no error when it is not.
  virtual Status ClearIntrospectionDue(const std::string& tenant_id, const std::string& session_id,
                                       Millis due_at) = 0;
  // Runtime-wide: idle introspections due at or before `now`, the longest due first. At most
  // `limit`.
  virtual Result<std::vector<IntrospectionDue>> DueIntrospections(Millis now, int limit) = 0;
};

}  // namespace keel::store
