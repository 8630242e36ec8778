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
  // A newer compaction: what it folded is dropped from the front; the rest is still all there
  // unless the entry left messages out at its end.
  if (known->after_id < after_id && !known->cut) return known->last_seq;
  return 0;
}

std::unique_ptr<ConversationEntry> Merge(std::unique_ptr<ConversationEntry> known, int64_t from,
                                         const std::string& after_id, store::Conversation fetched,
                                         int limit) {
  auto byId = [](const store::Message& a, const store::Message& b) { return a.id < b.id; };
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
  if (e.after_id != after_id) {
    auto first = std::upper_bound(m.begin(), m.end(), after_id,
                                  [](const std::string& id, const store::Message& x) {
                                    return id < x.id;
                                  });
    drop(m.begin(), first);
    e.after_id = after_id;
  }
  // The first `limit` of the union are each among the first `limit` of one side, so a cut on
  // either side stays correct; the new rows usually all follow the known ones.
  const bool fetched_cut = static_cast<int>(fetched.messages.size()) >= limit;
  const size_t mid = m.size();
  for (auto& x : fetched.messages) {
    e.bytes += CostOf(x);
    m.push_back(std::move(x));
  }
  if (mid > 0 && mid < m.size() && m[mid].id < m[mid - 1].id) {
    std::inplace_merge(m.begin(), m.begin() + static_cast<std::ptrdiff_t>(mid), m.end(), byId);
  }
  e.cut = e.cut || fetched_cut;
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
