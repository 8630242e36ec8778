#include "keel/runtime/conversation_cache.h"

#include <algorithm>

namespace keel::runtime {

namespace {
std::string KeyOf(const std::string& tenant_id, const std::string& session_id) {
  return tenant_id + "/" + session_id;
}
// What a message costs an entry: its text and a little for the rest, roughly.
size_t CostOf(const store::Message& m) { return 96 + m.content.size(); }
constexpr size_t kEntryCost = 256;  // an entry's own, besides its messages
}  // namespace

int64_t FetchFrom(const ConversationEntry* known, const std::string& after_id) {
  if (!known) return 0;
  if (known->after_id == after_id) return known->last_seq;
  // A newer compaction folded the entry's front through one of its messages: the rest is still
  // all there unless the entry left messages out at its end.
  if (known->cut) return 0;
  const auto& m = known->messages;
  const bool held =
      std::any_of(m.begin(), m.end(), [&](const store::Message& x) { return x.id == after_id; });
  return held ? known->last_seq : 0;
}

std::unique_ptr<ConversationEntry> Merge(std::unique_ptr<ConversationEntry> known, int64_t from,
                                         const std::string& after_id, store::Conversation fetched,
                                         int limit) {
  if (from <= 0 || !known) {
    known = std::make_unique<ConversationEntry>();
    known->bytes = kEntryCost;
  }
  ConversationEntry& e = *known;
  std::vector<store::Message>& m = e.messages;
  // Sizes are kept as messages come and go: a turn does not walk the whole conversation.
  auto drop = [&](auto from_it, auto to_it) {
    for (auto it = from_it; it != to_it; ++it) e.bytes -= CostOf(*it);
    m.erase(from_it, to_it);
  };
  if (e.after_id != after_id) {  // FetchFrom found the compaction's message in it
    auto folded =
        std::find_if(m.begin(), m.end(), [&](const store::Message& x) { return x.id == after_id; });
    drop(m.begin(), folded == m.end() ? m.end() : folded + 1);
    e.after_id = after_id;
  }
  // What came after last_seq follows what is known; a cut entry holds `limit` already, so what
  // comes after is past it.
  for (auto& x : fetched.messages) {
    e.bytes += CostOf(x);
    m.push_back(std::move(x));
  }
  e.cut = e.cut || static_cast<int>(fetched.messages.size()) >= limit;
  if (static_cast<int>(m.size()) > limit) {
    drop(m.begin() + limit, m.end());
    e.cut = true;
  }
  e.last_seq = std::max(e.last_seq, fetched.last_seq);
  return known;
}

std::unique_ptr<ConversationEntry> ConversationCache::Take(const std::string& tenant_id,
                                                           const std::string& session_id) {
  auto it = index_.find(KeyOf(tenant_id, session_id));
  if (it == index_.end()) return nullptr;
  std::unique_ptr<ConversationEntry> out = std::move(it->second->entry);
  bytes_ -= out->bytes;
  lru_.erase(it->second);
  index_.erase(it);
  return out;
}

void ConversationCache::Put(const std::string& tenant_id, const std::string& session_id,
                            std::unique_ptr<ConversationEntry> entry) {
  if (!entry || entry->bytes > max_bytes_ / 4) return;  // one session may not take it all
  (void)Take(tenant_id, session_id);  // another run put one meanwhile
  std::string key = KeyOf(tenant_id, session_id);
  bytes_ += entry->bytes;
  lru_.push_front(Slot{key, std::move(entry)});
  index_[std::move(key)] = lru_.begin();
  while (bytes_ > max_bytes_ && !lru_.empty()) {
    bytes_ -= lru_.back().entry->bytes;
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

}  // namespace keel::runtime
