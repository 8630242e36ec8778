// MemoryStore on PostgreSQL. `memories.tsv` is a stored tsvector of the text under the 'simple'
// configuration (lowercased words, no stemming, no stop words) after every run of characters
// other than letters and digits became a space, so that words split as SQLite's unicode61 splits
// them; a GIN index serves `tsv @@ query`. A search takes the agent's newest matches (seq, renewed
// by every write) up to kMemorySearchCandidates and orders them by ts_rank with normalization 1
// (divided by 1 + the log of the memory's length) against the query's words OR-ed
// (MemoryQuery::tsquery_rank), which weighs how often each occurs as SqliteTx's keel_rank does.

#include <algorithm>

#include "keel/store/postgres/postgres_tx.h"
#include "keel/store/rows.h"

namespace keel::store::postgres {

namespace {

using namespace rows;  // NOLINT: the shared record readers

double Score(const std::string& text) {
  try {
    return std::stod(text);
  } catch (...) {
    return 0;
  }
}

}  // namespace

// Pipelined: nothing is read back, so the insert goes out with the unit's next round trip (a
// failure fails the unit when it is collected).
Status PostgresTx::UpsertMemory(const Memory& m) {
  static const std::string kSql =
      "INSERT INTO memories(" + std::string(kMemoryCols) +
      ") VALUES($1,$2,$3,$4,$5,$6,$7,$8) ON CONFLICT(tenant_id, id) DO UPDATE SET "
      "text=EXCLUDED.text, tags=EXCLUDED.tags, source=EXCLUDED.source, "
      "updated_at=EXCLUDED.updated_at, seq=nextval('memories_seq') "
      "WHERE memories.agent_id = EXCLUDED.agent_id";
  KEEL_RETURN_IF_ERROR(BindTenant(m.tenant_id));
  return conn_.Send(kSql, P(m.id, m.tenant_id, m.agent_id, m.text, DumpJson(m.tags), m.source,
                            m.created_at, m.updated_at));
}

// Through keel_search_memories (migration 0020), which runs as the owner so that the GIN index
// may serve the match under row-level security, and reads only the tenant bound here.
Result<std::vector<MemoryHit>> PostgresTx::SearchMemories(const std::string& tenant_id,
                                                          const std::string& agent_id,
                                                          const MemorySearch& search) {
  static const std::string kSql = "SELECT " + std::string(kMemoryCols) +
                                  ", score FROM keel_search_memories($1, $2, $3, $4, "
                                  "$5, $6)";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(
      auto rows,
      conn_.QueryOnce(kSql, P(agent_id, search.query.tsquery, search.query.tsquery_rank, search.tag,
                              kMemorySearchCandidates, std::clamp(search.limit, 1, 100))));
  return Collect<MemoryHit>(rows, [](const Row& r) {
    return MemoryHit{ReadMemory(r), Score(r.Text(8))};
  });
}

}  // namespace keel::store::postgres
