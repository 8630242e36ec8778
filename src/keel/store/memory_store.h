#pragma once
// MemoryStore: an agent's long-term memories (texts with tags, searchable by full text) and its
// working memory (one text the model sees in every prompt). Memories belong to one agent of one
// tenant; a memory id is unique within its tenant.
//
// Full-text search, on both backends: the text is split into words (runs of letters and
// digits, lowercased, accents kept, no stemming), a query is a MemoryQuery rendered by
// memory::ParseQuery (never raw user text), and a hit's score grows with how often the query's
// terms occur in a memory and shrinks with the memory's length. SQLite ranks with FTS5 and a
// BM25-style function without document frequencies (sqlite_memory.cc); PostgreSQL with
// ts_rank over a 'simple' tsvector. The scores differ between backends; the order they give is
// meant to agree (tests/unit/memory_store_test.cc). Neither uses statistics of other agents'
// or tenants' memories.
//
// Recency bound: a search ranks at most kMemorySearchCandidates matches, the agent's most
// recently written ones (an upsert counts as a write). Below that many matches the ranking is
// exact; above it, a query that matches almost everything ranks the newest part of it, which
// keeps a search fast whatever the query (docs/MEMORY.md).

#include <string>
#include <vector>

#include "keel/common/status.h"
#include "keel/store/types.h"

namespace keel::store {

struct Memory {
  std::string id;  // unique within the tenant
  std::string tenant_id;
  std::string agent_id;
  std::string text;
  Json tags = Json::array();  // strings
  std::string source;         // who wrote it: api, tool, introspection, ...
  Millis created_at = 0;
  Millis updated_at = 0;
};

struct MemoryHit {
  Memory memory;
  double score = 0;  // higher is better; comparable only within one search
};

// The agent's working memory; text "" and updated_at 0 when it was never set.
struct WorkingMemory {
  std::string tenant_id;
  std::string agent_id;
  std::string text;
  Millis updated_at = 0;
};

// A parsed search query in each backend's language (memory::ParseQuery builds it).
struct MemoryQuery {
  // An FTS5 MATCH expression over the memory's words. Each phrase string begins with the marker
  // "$ " (the place of a backend's own prefix: SQLite's per-agent key), then its words.
  std::string fts5;
  std::string tsquery;  // text for to_tsquery('simple', ...): which memories match
  // The words the query looks for (not those it excludes) joined by OR, for to_tsquery: what
  // PostgreSQL ranks the matches by, so that ts_rank weighs how often each word occurs, as
  // keel_rank does, rather than how close together (its measure for AND queries).
  std::string tsquery_rank;
};

struct MemorySearch {
  MemoryQuery query;
  std::string tag;  // only memories with this tag; "" for any
  int limit = 10;   // 1..100
};

inline constexpr int kMemorySearchCandidates = 2000;

class MemoryStore {
 public:
  virtual ~MemoryStore() = default;
  // Inserts the memory, or replaces the text, tags, source and updated_at of the agent's
  // memory with its id (created_at stays). REQUIRES: tags is an array of strings, and no other
  // agent of the tenant has a memory with this id (see FindMemory; such a write changes
  // nothing).
  virtual Status UpsertMemory(const Memory& m) = 0;
  // The agent's memory. kNotFound "memory not found: ID".
  virtual Result<Memory> GetMemory(const std::string& tenant_id, const std::string& agent_id,
                                   const std::string& id) = 0;
  // The tenant's memory with this id, whichever agent's it is. kNotFound "memory not found: ID".
  virtual Result<Memory> FindMemory(const std::string& tenant_id, const std::string& id) = 0;
  // kNotFound "memory not found: ID".
  virtual Status DeleteMemory(const std::string& tenant_id, const std::string& agent_id,
                              const std::string& id) = 0;
  // The agent's memories, newest first (updated_at, then id, descending); `tag` "" for all.
  // kInvalidArgument for a cursor that is not one this list returned.
  virtual Result<Paged<Memory>> ListMemories(const std::string& tenant_id,
                                             const std::string& agent_id, const std::string& tag,
                                             const Page& page) = 0;
  // The best `search.limit` matches, best first; ties by updated_at descending, then id.
  virtual Result<std::vector<MemoryHit>> SearchMemories(const std::string& tenant_id,
                                                        const std::string& agent_id,
                                                        const MemorySearch& search) = 0;
  virtual Result<WorkingMemory> GetWorkingMemory(const std::string& tenant_id,
                                                 const std::string& agent_id) = 0;
  // The same, filled later (store.h, Tx).
  virtual Status GetWorkingMemoryLater(const std::string& tenant_id, const std::string& agent_id,
                                       WorkingMemory& out) = 0;
  // Inserts or replaces.
  virtual Status PutWorkingMemory(const WorkingMemory& w) = 0;
};

}  // namespace keel::store
