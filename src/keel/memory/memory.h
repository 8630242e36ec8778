#pragma once
// memory — an agent's long-term memories and its working memory, above the store's
// MemoryStore: what a memory may hold (MemoryFrom), writing one with its event in the caller's
// unit of work (Upsert, Delete, PutWorkingMemory), search (query.h for the language), the JSON
// the API, the tools and Lua plugins see, and the working memory's place in the prompt.
//
// Used by the API (api_memory.cc), the built-in tools memory.search, memory.upsert and
// memory.delete (tools/memory_tools.cc), the runtime (the prompt; memory.upsert@v1 for plugins)
// and the Lua plugins' read-only ctx.memory. Pure functions over a Tx: the caller chooses how to
// read (Store::Read on the tool pool; store::AsyncRead for a Lua plugin's ctx.memory, which on
// PostgreSQL reads off the event loop).

#include <string>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/store/memory_store.h"
#include "keel/store/store.h"

namespace keel::memory {

inline constexpr size_t kMaxTextBytes = 16 * 1024;
inline constexpr size_t kMaxWorkingMemoryBytes = 16 * 1024;
inline constexpr int kMaxTags = 20;
inline constexpr size_t kMaxTagBytes = 64;
inline constexpr int kDefaultSearchLimit = 10;
inline constexpr int kMaxSearchLimit = 100;

// A memory to write, checked, from `fields`: {"text", "tags"?, "id"?, "source"?}. text: 1 to
// kMaxTextBytes, not only white space; tags: at most kMaxTags distinct strings of 1 to
// kMaxTagBytes without control characters (repeats dropped); id: 1 to 128 of A-Z a-z 0-9 . _ : -
// starting with a letter or digit, a new UUIDv7 when absent; source: 1 to 32 of a-z 0-9 . _ -
// starting with a letter, `default_source` when absent. Another field is an error.
// kInvalidArgument naming the field.
Result<store::Memory> MemoryFrom(const Json& fields, const std::string& tenant_id,
                                 const std::string& agent_id, const std::string& default_source);
// kInvalidArgument unless `tag` is a valid tag.
Status CheckTag(const std::string& tag);
// kInvalidArgument unless 1 <= limit <= kMaxSearchLimit.
Status CheckSearchLimit(int limit);

struct Upserted {
  store::Memory memory;  // as stored (created_at kept when it replaced one)
  bool replaced = false;
};
// Writes `m` (a new one, or a replacement of the agent's memory with its id) and appends
// memory.upserted@v1, scoped to the agent and, for a tool's write, to its session and run.
// kConflict "memory ID belongs to another agent" when another agent of the tenant has that id.
// REQUIRES: `m` comes from MemoryFrom.
Result<Upserted> Upsert(store::Tx& tx, store::Memory m, const std::string& session_id = "",
                        const std::string& run_id = "");
// Deletes the agent's memory and appends memory.deleted@v1. kNotFound "memory not found: ID".
Status Delete(store::Tx& tx, const std::string& tenant_id, const std::string& agent_id,
              const std::string& id, const std::string& session_id = "",
              const std::string& run_id = "");
// Searches the agent's memories with a query of the memory language (query.h): kInvalidArgument
// for a bad query, tag or limit.
Result<std::vector<store::MemoryHit>> Search(store::Tx& tx, const std::string& tenant_id,
                                             const std::string& agent_id, const std::string& query,
                                             const std::string& tag, int limit);
// Replaces the agent's working memory ("" clears it) and appends working_memory.updated@v1,
// scoped to the session and run of an introspection's write. kInvalidArgument beyond
// kMaxWorkingMemoryBytes.
Result<store::WorkingMemory> PutWorkingMemory(store::Tx& tx, const std::string& tenant_id,
                                              const std::string& agent_id, std::string text,
                                              const std::string& session_id = "",
                                              const std::string& run_id = "");

// {"id", "agent_id", "text", "tags", "source", "created_at", "updated_at"}, plus "score" for a hit.
Json MemoryJson(const store::Memory& m);
Json HitJson(const store::MemoryHit& hit);
// The payload of the plugin event memory.upsert@v1: {"agent_id", "session_id", "run_id",
// "memory_id", "text", "tags", "source", "replaced"} (session and run null unless a tool wrote it).
Json UpsertPayload(const store::Memory& m, bool replaced, const std::string& session_id,
                   const std::string& run_id);

// The system message that shows the model the agent's working memory, or "" when it has none.
std::string WorkingMemoryPrompt(const store::WorkingMemory& w);

// What the tools and Lua plugins are shown: a search's hits as a JSON array of HitJson (the
// errors as Search's), and one memory as MemoryJson or null when the agent has none with `id`.
Result<Json> SearchJson(store::Tx& tx, const std::string& tenant_id, const std::string& agent_id,
                        const std::string& query, const std::string& tag, int limit);
Result<Json> GetJson(store::Tx& tx, const std::string& tenant_id, const std::string& agent_id,
                     const std::string& id);

}  // namespace keel::memory
