#pragma once
// The SQLite side of memory search that lives outside SqliteTx: keel_rank, the FTS5 ranking
// function of memories_fts, registered on every connection (Db::Open).

#include "keel/common/status.h"

struct sqlite3;

namespace keel::store::sqlite {

// keel_rank(memories_fts): for each phrase of the query, BM25's term-frequency saturation
// tf*(k1+1) / (tf + k1*(1 - b + b*len/kAverageWords)) over the memory's text column (k1 1.2,
// b 0.75), summed; higher is better. No inverse document frequency: that would read every match
// of every term (milliseconds per common term at a million memories) and would let other
// tenants' memories sway a tenant's ranking. kUnavailable when this SQLite lacks FTS5.
Status RegisterMemoryRank(sqlite3* db);

}  // namespace keel::store::sqlite
