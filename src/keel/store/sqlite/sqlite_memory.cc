// MemoryStore on SQLite. Memories live in `memories`; `memories_fts` is an FTS5 index over them
// (external content, kept in step by triggers) with two columns: `body`, the text, and `scope`,
// a token for each tag. Both are tokenized by `keel_agent`: unicode61 without diacritic folding,
// except that the first token of each text is a key naming the agent ("k" + hex(agent id)),
// which is not indexed but prefixed to every other token ("k...:word"). Each agent thus has
// words of its own in the index: a search for one agent reads that agent's postings only,
// however many memories other agents have, and needs no filter that would walk every memory of
// a big agent. (`body` is a generated column, key + text; `scope` is written with the row.)
//
// seq rises with every write (a replacement takes a new one), and the FTS rowid is -seq
// (`fts_rowid`): the newest memory has the smallest, so the recency bound
// (kMemorySearchCandidates) is FTS5's ascending walk cut short by LIMIT, its fast direction,
// while the table itself grows at its end. keel_rank scores only `body`.

#include "keel/store/sqlite/sqlite_memory.h"

#include <sqlite3.h>

#include <algorithm>

#include "keel/store/rows.h"
#include "keel/store/sqlite/sqlite_tx.h"

namespace keel::store::sqlite {

namespace {

using namespace rows;  // NOLINT: the shared record readers

// The scope column's value, an SQL expression over the agent id and the tags (JSON text): the
// agent's key and a token for each tag, "t" + hex(tag) (one token whatever the tag holds).
std::string ScopeSql(const std::string& agent, const std::string& tags) {
  return "'k' || hex(" + agent + ") || coalesce((SELECT group_concat(' t' || hex(value), '') " +
         "FROM json_each(" + tags + ")), '')";
}

// keel_agent: unicode61 (remove_diacritics 0), with each text's first token taken as the key
// that prefixes the others (see the top of this file).
struct AgentTokenizer {
  fts5_tokenizer inner_fns;
  Fts5Tokenizer* inner = nullptr;
};

struct AgentTokenizeCall {
  void* ctx;
  int (*emit)(void*, int, const char*, int, int, int);
  std::string key;  // empty until the first token
  std::string token;
};

int AgentToken(void* call_ptr, int flags, const char* token, int n, int start, int end) {
  auto* call = static_cast<AgentTokenizeCall*>(call_ptr);
  if (call->key.empty()) {
    call->key.assign(token, n);
    call->key += ':';
    return SQLITE_OK;
  }
  call->token = call->key;
  call->token.append(token, n);
  return call->emit(call->ctx, flags, call->token.data(), static_cast<int>(call->token.size()),
                    start, end);
}

int AgentTokenizerCreate(void* api_ptr, const char**, int, Fts5Tokenizer** out) {
  auto* api = static_cast<fts5_api*>(api_ptr);
  auto t = std::make_unique<AgentTokenizer>();
  void* inner_ctx = nullptr;
  int rc = api->xFindTokenizer(api, "unicode61", &inner_ctx, &t->inner_fns);
  if (rc != SQLITE_OK) return rc;
  const char* args[] = {"remove_diacritics", "0"};
  rc = t->inner_fns.xCreate(inner_ctx, args, 2, &t->inner);
  if (rc != SQLITE_OK) return rc;
  *out = reinterpret_cast<Fts5Tokenizer*>(t.release());
  return SQLITE_OK;
}

void AgentTokenizerDelete(Fts5Tokenizer* tokenizer) {
  auto* t = reinterpret_cast<AgentTokenizer*>(tokenizer);
  if (t->inner) t->inner_fns.xDelete(t->inner);
  delete t;
}

int AgentTokenize(Fts5Tokenizer* tokenizer, void* ctx, int flags, const char* text, int n,
                  int (*emit)(void*, int, const char*, int, int, int)) {
  auto* t = reinterpret_cast<AgentTokenizer*>(tokenizer);
  AgentTokenizeCall call{ctx, emit, {}, {}};
  return t->inner_fns.xTokenize(t->inner, &call, flags, text, n, AgentToken);
}

// BM25's constants, and the length a memory is taken to have on average (a constant rather than
// the index's own average, which other tenants' memories would move).
constexpr double kK1 = 1.2;
constexpr double kB = 0.75;
constexpr double kAverageWords = 32.0;

void KeelRank(const Fts5ExtensionApi* api, Fts5Context* fts, sqlite3_context* ctx, int,
              sqlite3_value**) {
  int words = 0;
  if (api->xColumnSize(fts, 0, &words) != SQLITE_OK) words = 0;
  const double norm = kK1 * (1 - kB + kB * words / kAverageWords);
  double score = 0;
  const int phrases = api->xPhraseCount(fts);
  for (int p = 0; p < phrases; ++p) {
    Fts5PhraseIter it;
    int column = -1;
    int offset = 0;
    int tf = 0;
    if (api->xPhraseFirst(fts, p, &it, &column, &offset) != SQLITE_OK) continue;
    for (; column >= 0; api->xPhraseNext(fts, &it, &column, &offset)) {
      if (column == 0) ++tf;  // the text; the scope's tokens do not count
    }
    if (tf > 0) score += tf * (kK1 + 1) / (tf + norm);
  }
  sqlite3_result_double(ctx, score);
}

std::string Hex(const std::string& s) {
  static constexpr char kDigits[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) {
    out += kDigits[c >> 4];
    out += kDigits[c & 0xF];
  }
  return out;
}

}  // namespace

Status RegisterMemoryFunctions(sqlite3* db) {
  fts5_api* api = nullptr;
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, "SELECT fts5(?1)", -1, &stmt, nullptr) == SQLITE_OK) {
    sqlite3_bind_pointer(stmt, 1, static_cast<void*>(&api), "fts5_api_ptr", nullptr);
    sqlite3_step(stmt);
  }
  sqlite3_finalize(stmt);
  if (api == nullptr || api->iVersion < 2) {
    return Unavailable("this SQLite has no FTS5 (memory search needs it)");
  }
  if (api->xCreateFunction(api, "keel_rank", nullptr, KeelRank, nullptr) != SQLITE_OK) {
    return Internal("could not register keel_rank with FTS5");
  }
  fts5_tokenizer tokenizer{AgentTokenizerCreate, AgentTokenizerDelete, AgentTokenize};
  if (api->xCreateTokenizer(api, "keel_agent", api, &tokenizer, nullptr) != SQLITE_OK) {
    return Internal("could not register the keel_agent tokenizer with FTS5");
  }
  return Status::Ok();
}

// A write renews seq (the newest memory has the highest), which the recency bound follows.
Status SqliteTx::UpsertMemory(const Memory& m) {
  static const std::string kSql =
      "INSERT INTO memories(" + std::string(kMemoryCols) +
      ", scope) VALUES(?1,?2,?3,?4,?5,?6,?7,?8," + ScopeSql("?3", "?5") +
      ") ON CONFLICT(tenant_id, id) DO UPDATE SET text=excluded.text, tags=excluded.tags, "
      "source=excluded.source, updated_at=excluded.updated_at, scope=excluded.scope, "
      "seq=(SELECT max(seq) + 1 FROM memories) WHERE memories.agent_id = excluded.agent_id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s
      .BindAll(m.id, m.tenant_id, m.agent_id, m.text, DumpJson(m.tags), m.source, m.created_at,
               m.updated_at)
      .Run();
}

// The candidates are the agent's newest matches (ORDER BY rowid LIMIT: FTS5 stops after them),
// so keel_rank scores at most kMemorySearchCandidates rows.
Result<std::vector<MemoryHit>> SqliteTx::SearchMemories(const std::string& tenant_id,
                                                        const std::string& agent_id,
                                                        const MemorySearch& search) {
  // Only the candidates scoring at least the limit-th best score (ties included) are joined to
  // their rows: the rest cannot be among the results, and reading thousands of rows scattered
  // over the table was most of a broad search's time.
  static const std::string kSql =
      "WITH c AS MATERIALIZED (SELECT rowid AS fts_rowid, keel_rank(memories_fts) AS score "
      "FROM memories_fts WHERE memories_fts MATCH ?1 ORDER BY rowid LIMIT ?2), "
      "cut AS (SELECT coalesce((SELECT score FROM c ORDER BY score DESC LIMIT 1 OFFSET ?5 - 1), "
      "-1e308) AS least) "
      "SELECT m.id, m.tenant_id, m.agent_id, m.text, m.tags, m.source, m.created_at, "
      "m.updated_at, c.score FROM c JOIN memories AS m ON m.seq = -c.fts_rowid "
      "WHERE c.score >= (SELECT least FROM cut) AND m.tenant_id = ?3 AND m.agent_id = ?4 "
      "ORDER BY c.score DESC, m.updated_at DESC, m.id LIMIT ?5";
  // Every phrase of the query starts with the marker "$ ": the agent's key goes there.
  const std::string key = "\"k" + Hex(agent_id) + " ";
  std::string match = "body : (";
  const std::string& fts5 = search.query.fts5;
  for (size_t i = 0; i < fts5.size(); ++i) {
    if (fts5.compare(i, 3, "\"$ ") == 0) {
      match += key;
      i += 2;
    } else {
      match += fts5[i];
    }
  }
  match += ")";
  if (!search.tag.empty()) match += " AND scope : " + key + "t" + Hex(search.tag) + "\"";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(match, kMemorySearchCandidates, tenant_id, agent_id, std::clamp(search.limit, 1, 100));
  return Collect<MemoryHit>(s, [](const Stmt& r) { return MemoryHit{ReadMemory(r), r.Double(8)}; });
}

// ImportRow leaves the scope empty (and seq to SQLite, rising in import order: each agent's
// oldest first, as writes would have left them); the update trigger indexes each row again.
Status SqliteTx::ScopeImportedMemories() {
  static const std::string kSql =
      "UPDATE memories SET scope = " + ScopeSql("agent_id", "memories.tags") + " WHERE scope = ''";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.Run();
}

}  // namespace keel::store::sqlite
