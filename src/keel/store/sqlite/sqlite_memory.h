#pragma once
// The SQLite side of memory search that lives outside SqliteTx, registered with FTS5 on every
// connection (Db::Open): keel_rank, the ranking function of memories_fts, and keel_agent, its
// tokenizer (sqlite_memory.cc).

#include "keel/common/status.h"

struct sqlite3;

namespace keel::store::sqlite {

// keel_rank(memories_fts): for each phrase of the query, BM25's term-frequency saturation
// tf*(k1+1) / (tf + k1*(1 - b + b*len/kAverageWords)) over the memory's text column (k1 1.2,
// b 0.75), summed; higher is better. No inverse document frequency: that would read every match
// of every term (milliseconds per common term at a million memories) and would let other
// tenants' memories sway a tenant's ranking. kUnavailable when this SQLite lacks FTS5.
Status RegisterMemoryFunctions(sqlite3* db);

}  // namespace keel::store::sqlite
