#pragma once
// `keel export` / `keel import`: a store's rows as a portable archive, the same bytes whichever
// backend wrote them, so data moves between SQLite and PostgreSQL.
//
// The archive is a tar (pax) compressed with zstd. Its first entry is manifest.json:
//   {"format": "keel-export", "version": 8, "created_at": MILLIS,
//    "tenant": {"id", "name", "created_at"} | null (null: every tenant),
//    "tables": {"agents": {"rows": N, "sha256": HEX}, ...}}
// then one TABLE.jsonl per table of ExportTables() (store.h), in that order: one JSON object per
// line, fields named like the columns, rows in primary key order (events by position). JSON-text
// columns (tools, payload, ...) stay strings, verbatim. api_tokens carries hashes only; secrets
// are never stored.
//
// A table added to ExportTables() after version 2 raises the version, so that an archive lacking
// it is told from one that lost an entry; ImportArchive still reads the older versions, whose
// archives lack those tables (they import as empty).
//
// Both functions run on the calling thread and hold the whole archive in memory.

#include <string>

#include "keel/common/status.h"
#include "keel/store/store.h"

namespace keel::store {

inline constexpr const char* kArchiveFormat = "keel-export";
// 2: tenant_keys and secrets; 3: plugins and agent_plugins; 4: schedules, memories, skills,
// compactions and usage; 5: sessions.description; 6: sessions.created_by, and
// tenants.allow_host_exec and allow_stdio_mcp; 7: the audit chain (events.hash, audit_heads),
// events.tenant_position, and origin_seq per (tenant, origin) (older archives' events are
// numbered so on import, as the migration does, and hashed); 8: messages.seq (older archives'
// messages are numbered per session in id order on import, as the migration does); 9:
// sessions.instructions; 10: api_tokens.parent_id and expires_at (dashboard sign-ins); 11:
// channels; 12: users, identities, agent roles and access, api_tokens.user_id; 13:
// channel_conversations.contact and agent_access.guest_daily_tokens; 14: schedules.user_id;
// 15: schedules.channel_id; 16: runs.user_id and channel_id.
inline constexpr int kArchiveVersion = 16;
// The oldest version ImportArchive reads.
inline constexpr int kOldestArchiveVersion = 2;
// The most an archive may hold uncompressed (ImportArchive reads it into memory whole).
inline constexpr size_t kMaxArchiveBytes = size_t(1) << 30;

// Gives `row` of table `t`, as written by archive version `version`, the columns its table
// gained in later versions, with the values rows had when each was added (0: every such
// column it lacks; a row image from before a column existed, for `keel store rebuild`).
void FillAddedColumns(const ExportTableSpec& t, int version, Json& row);

// Writes the archive of `tenant_id`'s rows (every tenant's when empty) to `path`, replacing it.
// One Store::Read: a consistent snapshot even while a server writes to the store.
// kNotFound for an unknown tenant.
Status ExportArchive(Store& store, const std::string& tenant_id, const std::string& path);

// Reads the archive at `path` into `store`. The whole archive is validated first (format,
// version, exactly the expected entries, row counts, checksums, every row's fields and types,
// and its audit chains: every event's hash along its chain, each chain's head and, with
// `audit_key`, the head's signature, store/audit.h), then imported in one unit of work that
// also checks that the store is empty: on any error nothing is written. Versions
// kOldestArchiveVersion to kArchiveVersion are read (before 7, without chains: their events are
// hashed as imported). kInvalidArgument for a bad archive (a broken chain names its first wrong
// event), kConflict for a store that already holds data.
Status ImportArchive(Store& store, const std::string& path, const std::string& audit_key = "");

}  // namespace keel::store
