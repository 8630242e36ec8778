#pragma once
// The conversations this node read lately, so that a turn reads only the messages committed
// since its session's last turn, not the whole conversation since the session's compaction.
//
// A session's messages are only ever inserted, and each gets the next seq of its session in
// commit order (store::Message::seq), which is the conversation's order. An entry holds the
// conversation since a compaction as of a seq: every message with a lower or equal seq is in
// it, or lies past its `limit` (then `cut`). The next read asks the store for what has a
// greater seq (ConversationSince with FetchFrom's seq) and Merge appends it; a newer compaction
// drops the entry's front, through the compaction's message. A run takes
// its session's entry out of the cache for its reads (which may run on a store thread) and puts
// it back after: an entry is never shared. The cache itself is for the io thread only.

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "keel/common/crypto.h"
#include "keel/store/compaction_store.h"
#include "keel/store/types.h"

namespace keel::runtime {

// What a session's history hashed to when its last turn's cache key was taken (HashHistory):
// the SHA-256 state after its first `count` messages, the first and the last of them named.
struct HistoryHash {
  std::string first_id, last_id;
  size_t count = 0;  // messages hashed
  size_t sent = 0;   // of them, those a request carries (InConversation)
  size_t bytes = 0;  // their text
  std::unique_ptr<FieldDigest> state;
};

struct ConversationEntry {
  std::string after_id;  // the compaction's last message ("" when the session has none)
  int64_t last_seq = 0;  // every message of the session with seq <= it is accounted for
  bool cut = false;      // messages after `messages` were left out at the limit
  std::vector<store::Message> messages;  // user and assistant, after after_id, in seq order
  size_t bytes = 0;  // what it costs: its messages' text and a little more (Merge keeps it)
  HistoryHash history;  // of the messages the last turn was sent
};

// The seq to read the conversation since the compaction that ends at `after_id` after, given
// what is known of it (0: read it whole).
int64_t FetchFrom(const ConversationEntry* known, const std::string& after_id);

// What is known (used when `from` > 0, as FetchFrom answered for it) with what the store
// returned for ConversationSince(after_id, from, limit).
std::unique_ptr<ConversationEntry> Merge(std::unique_ptr<ConversationEntry> known, int64_t from,
                                         const std::string& after_id, store::Conversation fetched,
                                         int limit);

class ConversationCache {
 public:
  // At most `max_bytes` of message contents in all.
  explicit ConversationCache(size_t max_bytes) : max_bytes_(max_bytes) {}

  // The session's entry, out of the cache (null when there is none).
  std::unique_ptr<ConversationEntry> Take(const std::string& tenant_id,
                                          const std::string& session_id);
  // Keeps `entry` as the session's, dropping the least recently used over the size.
  void Put(const std::string& tenant_id, const std::string& session_id,
           std::unique_ptr<ConversationEntry> entry);

 private:
  struct Slot {
    std::string key;
    std::unique_ptr<ConversationEntry> entry;
  };
  const size_t max_bytes_;
  size_t bytes_ = 0;
  std::list<Slot> lru_;  // most recently used first
  std::unordered_map<std::string, std::list<Slot>::iterator> index_;
};

}  // namespace keel::runtime
