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

// A summary of a session's conversation up to and including `last_message_id` (every earlier
// message of the session, and the summary before it). The newest one of a session is the one a
// context uses.
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

class CompactionStore {
 public:
  virtual ~CompactionStore() = default;
  // kConflict when the id exists.
  virtual Status InsertCompaction(const Compaction& c) = 0;
  // The session's newest compaction, if any.
  virtual Result<std::optional<Compaction>> LatestCompaction(const std::string& tenant_id,
                                                             const std::string& session_id) = 0;
  // The session's compactions, oldest first.
  virtual Result<Paged<Compaction>> ListCompactions(const std::string& tenant_id,
                                                    const std::string& session_id,
                                                    const Page& page) = 0;
  // The session's `user` and `assistant` messages with after_id < id < before_id (after_id ""
  // from the first), oldest first, at most `limit`: the conversation since a compaction. Each
  // holds its id, role and content only.
  virtual Result<std::vector<Message>> ConversationSince(const std::string& tenant_id,
                                                         const std::string& session_id,
                                                         const std::string& after_id,
                                                         const std::string& before_id,
                                                         int limit) = 0;
};

}  // namespace keel::store
