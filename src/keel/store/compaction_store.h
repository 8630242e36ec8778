#pragma once
// Compaction (docs/CONTEXT.md): when a session's context would exceed its agent's token budget,
// the oldest turns are summarized by the model into a compaction record, which stands for them
// in later contexts. The messages themselves are never changed: the full history stays.
// The record and its storage port, and the read context assembly needs.

#include <optional>
#include <string>
#include <vector>

#include "keel/common/status.h"
#include "keel/store/types.h"

namespace keel::store {

// A summary of a session's conversation up to and including `last_message_id` (every message
// of the session committed before it, and the summary before it). The newest one of a session is
// the one a context uses.
struct Compaction {
  std::string id;  // UUIDv7: a later compaction of the session has a greater id
  std::string tenant_id;
  std::string session_id;
  std::string run_id;  // the run whose context assembly made it
  std::string last_message_id;
  std::string summary;
  int64_t messages = 0;       // messages folded into the summary by this compaction
  int64_t tokens_before = 0;  // the context's estimated tokens before it
  int64_t tokens_after = 0;   // and after it
  Millis created_at = 0;
};

// What ConversationSince read.
struct Conversation {
  std::vector<Message> messages;
  int64_t last_seq = 0;  // the session's newest message's seq (0: it has none)
};

class CompactionStore {
 public:
  virtual ~CompactionStore() = default;
  // kConflict when the id exists.
  virtual Status InsertCompaction(const Compaction& c) = 0;
  // The session's newest compaction, if any: a Later read (store.h: Tx).
  virtual Status LatestCompactionLater(const std::string& tenant_id, const std::string& session_id,
                                       std::optional<Compaction>& out) = 0;
  // The session's compactions, oldest first.
  virtual Result<Paged<Compaction>> ListCompactions(const std::string& tenant_id,
                                                    const std::string& session_id,
                                                    const Page& page) = 0;
  // The conversation since a compaction: the first `limit` of the session's `user` and
  // `assistant` messages committed after the message `after_id` ("" from the first) and with
  // seq > after_seq, in seq order, each with its id, role, content and seq only; and the seq of
  // the session's newest message of any role. A message's seq is its place in the session in
  // commit order: a reader that saw every message up to seq N finds the others with N.
  virtual Result<Conversation> ConversationSince(const std::string& tenant_id,
                                                 const std::string& session_id,
                                                 const std::string& after_id, int64_t after_seq,
                                                 int limit) = 0;
  // ConversationSince after the last message of the session's newest compaction (from the first
  // when it has none), which the statement reads itself: so that a turn's read of the newest
  // compaction (LatestCompactionLater) and of the conversation after it go out together. A
  // caller that needs after_seq to depend on the compaction checks it against what the
  // compaction read found.
  virtual Result<Conversation> ConversationSinceLatest(const std::string& tenant_id,
                                                       const std::string& session_id,
                                                       int64_t after_seq, int limit) = 0;
};

}  // namespace keel::store
