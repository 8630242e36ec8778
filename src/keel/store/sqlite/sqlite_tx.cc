#include "keel/store/sqlite/sqlite_tx.h"

#include <sqlite3.h>

#include <algorithm>

#include "keel/common/ids.h"
#include "keel/store/compaction_rows.h"
#include "keel/store/row_images.h"
#include "keel/store/rows.h"
#include "keel/store/schedule_rows.h"

namespace keel::store::sqlite {
namespace {

using namespace rows;  // NOLINT: the shared record readers

// A session's unfinished runs through runs_session_active: its WHERE term word for word, so
// that SQLite sees the query implies it (migration 0022 says why ORs and not an IN list).
constexpr char kSessionActive[] =
    "runs INDEXED BY runs_session_active WHERE tenant_id=?1 AND session_id=?2 AND "
    "(status='queued' OR status='running' OR status='waiting_for_approval')";

// A tenant's runs in flight through runs_tenant_active, one status at a time: an IN list that
// drives an index's key is a temporary b-tree SQLite builds for each statement it runs.
const std::string kTenantInFlight =
    "((SELECT count(*) FROM runs INDEXED BY runs_tenant_active WHERE tenant_id=?1 AND "
    "status='queued' AND status IN ('queued','running')) + (SELECT count(*) FROM runs INDEXED "
    "BY runs_tenant_active WHERE tenant_id=?1 AND status='running' AND status IN "
    "('queued','running')))";

}  // namespace

// ---- TenantStore

Result<std::vector<Tenant>> SqliteTx::ListTenants() {
  static const std::string kSql =
      "SELECT " + std::string(kTenantCols) + " FROM tenants ORDER BY id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return Collect<Tenant>(s, ReadTenant<Stmt>);
}

// ---- TokenStore

Result<Token> SqliteTx::FindActiveTokenByHash(const std::string& hash) {
  static const std::string kSql = "SELECT " + std::string(kTokenCols) +
                                            " FROM api_tokens WHERE hash=? AND revoked_at IS NULL";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(hash);
  return One<Token>(s, ReadToken<Stmt>, "token not found");
}

// ---- ChannelStore

Result<std::string> SqliteTx::ChannelTenant(const std::string& id) {
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare("SELECT tenant_id FROM channels WHERE id=?"));
  s.BindAll(id);
  KEEL_ASSIGN_OR_RETURN(bool found, s.Step());
  if (!found) return NotFound("channel not found: " + id);
  return s.Text(0);
}

Result<std::vector<Channel>> SqliteTx::PolledChannels() {
  static const std::string kSql =
      "SELECT " + std::string(kChannelCols) +
      " FROM channels WHERE kind IN ('telegram','discord') AND enabled=1 ORDER BY id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return Collect<Channel>(s, ReadChannel<Stmt>);
}

Result<std::vector<ChannelLease>> SqliteTx::ChannelLeases() {
  static const std::string kSql =
      "SELECT tenant_id, channel_id, holder, held_until, CASE WHEN cursor GLOB '[0-9]*/*' "
      "THEN substr(cursor, 1, instr(cursor, '/') - 1) ELSE '' END FROM channel_polls "
      "WHERE holder<>'' ORDER BY channel_id";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return Collect<ChannelLease>(s, [](const Stmt& r) {
    return ChannelLease{r.Text(0), r.Text(1), r.Text(2), r.Int(3), r.Text(4)};
  });
}

Result<std::vector<ChannelReply>> SqliteTx::DueReplies(Millis now, const std::string& origin,
                                                       int limit) {
  static const std::string kSql =
      "SELECT " + std::string(kReplyCols) +
      " FROM channel_replies o WHERE status IN ('waiting','pending','sending','shown') AND ("
      "(status='pending' AND next_attempt_at<=?1) OR "
      "(status='sending' AND (next_attempt_at<=?1 OR origin=?2)) OR "
      "(status='waiting' AND EXISTS (SELECT 1 FROM runs r WHERE r.tenant_id=o.tenant_id AND "
      "r.id=o.run_id AND r.status IN ('done','failed','cancelled'))) OR "
      "(status='shown' AND EXISTS (SELECT 1 FROM approvals a WHERE a.tenant_id=o.tenant_id AND "
      "a.id=o.approval_id AND a.status<>'pending'))) "
      "ORDER BY next_attempt_at, id LIMIT ?3";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(now, origin, limit);
  return Collect<ChannelReply>(s, ReadReply<Stmt>);
}

Result<std::vector<std::pair<std::string, std::string>>> SqliteTx::ApprovalsToCard(int limit) {
  static const std::string kSql =
      "SELECT a.tenant_id, a.id FROM channel_replies o JOIN approvals a ON "
      "a.tenant_id=o.tenant_id AND a.run_id=o.run_id WHERE o.status='waiting' AND "
      "o.approval_id='' AND a.status='pending' AND NOT EXISTS (SELECT 1 FROM channel_replies c "
      "WHERE c.tenant_id=a.tenant_id AND c.approval_id=a.id) ORDER BY a.created_at, a.id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(limit);
  std::vector<std::pair<std::string, std::string>> out;
  while (true) {
    KEEL_ASSIGN_OR_RETURN(bool found, s.Step());
    if (!found) break;
    out.emplace_back(s.Text(0), s.Text(1));
  }
  return out;
}

// ---- RunStore

Result<int64_t> SqliteTx::CountQueuedRuns() {
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare("SELECT count(*) FROM runs WHERE status='queued'"));
  KEEL_ASSIGN_OR_RETURN(bool found, s.Step());
  return found ? s.Int(0) : 0;
}

Result<std::vector<NodeInfo>> SqliteTx::ListNodes(Millis) { return std::vector<NodeInfo>{}; }

// ---- ApprovalStore

Result<std::vector<Approval>> SqliteTx::ExpiredApprovals(Millis now, int limit) {
  static const std::string kSql = "SELECT " + std::string(kApprovalCols) +
                                  " FROM approvals WHERE status='pending' AND expires_at<? "
                                  "ORDER BY expires_at, id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(now, limit);
  return Collect<Approval>(s, ReadApproval<Stmt>);
}

// ---- PluginStore

Result<std::vector<PluginDelivery>> SqliteTx::DueDeliveries(Millis now, int limit) {
  static const std::string kSql = "SELECT " + std::string(kDeliveryCols) +
                                  " FROM plugin_deliveries WHERE status='pending' AND "
                                  "next_attempt_at<=? ORDER BY next_attempt_at, id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(now, limit);
  return Collect<PluginDelivery>(s, ReadDelivery<Stmt>);
}

// ---- RunStore

Result<bool> SqliteTx::SessionBusy(const std::string& tenant_id, const std::string& session_id) {
  static const std::string kSql = "SELECT 1 FROM " + std::string(kSessionActive) + " LIMIT 1";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, session_id);
  return s.Step();
}

Result<RunStore::IntakeView> SqliteTx::ForIntake(const std::string& tenant_id,
                                                 const std::string& session_id) {
  static const std::string kSql = "SELECT " + std::string(kSessionCols) +
                                  ", EXISTS(SELECT 1 FROM " + kSessionActive + "), " +
                                  kTenantInFlight + " FROM sessions WHERE tenant_id=?1 AND id=?2";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, session_id);
  KEEL_ASSIGN_OR_RETURN(bool found, s.Step());
  if (!found) return NotFound("session not found: " + session_id);
  IntakeView v;
  v.session = ReadSession(s);
  v.busy = s.Int(kSessionColCount) != 0;
  v.active_runs = s.Int(kSessionColCount + 1);
  return v;
}

Result<RunStore::IntakeRead> SqliteTx::ReadForIntake(const std::string& tenant_id,
                                                     const std::string& session_id) {
  static const std::string kSql =
      "SELECT " + Qualified(kSessionCols, "s") + ", EXISTS(SELECT 1 FROM " + kSessionActive +
      "), coalesce((SELECT version FROM settings_versions WHERE tenant_id=?1), 0), " +
      Qualified(kAgentCols, "a") +
      " FROM sessions s LEFT JOIN agents a ON a.tenant_id=s.tenant_id AND a.id=s.agent_id AND "
      "a.status != 'deleted' WHERE s.tenant_id=?1 AND s.id=?2";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, session_id);
  KEEL_ASSIGN_OR_RETURN(bool found, s.Step());
  if (!found) return NotFound("session not found: " + session_id);
  IntakeRead out;
  out.session = ReadSession(s);
  out.busy = s.Int(kSessionColCount) != 0;
  out.settings_version = s.Int(kSessionColCount + 1);
  if (!s.IsNull(kSessionColCount + 2)) {
    out.agent = ReadAgent(Shifted<Stmt>{s, kSessionColCount + 2});
  }
  return out;
}

Status SqliteTx::StartIdleSession(const std::string& tenant_id, const std::string& session_id,
                                  const std::string& agent_id, int64_t max_active, Millis at) {
  // ForIntake's conditions, checked by the update itself.
  static const std::string kSql =
      "UPDATE sessions SET status='running', updated_at=?3 WHERE tenant_id=?1 AND id=?2 AND "
      "agent_id=?4 AND status!='inactive' AND NOT EXISTS(SELECT 1 FROM " +
      std::string(kSessionActive) + ") AND " + kTenantInFlight + " < ?5";
  return sql_.ExecChanging(Conflict("session " + session_id + " changed since intake read it"),
                           kSql, tenant_id, session_id, at, agent_id, max_active);
}

Result<std::vector<Run>> SqliteTx::ClaimableRuns(Millis now, int limit) {
  // Two index range scans on (status, lease_expires_at); an OR would scan the whole table. A
  // queued run waits for its session's running and waiting runs, whatever their ids (a run
  // claimed at intake may have a later id than a message queued behind it), and for the
  // session's queued runs before it; they are looked up by session among the unfinished runs
  // (runs_session_active), so that a long session's finished runs are not walked. The tenants take
  // turns (every tenant's oldest, then every tenant's second, ...), so that one tenant's long queue
  // cannot fill the page and hide the others' runs from the dispatcher.
  static const std::string kSql =
      "SELECT " + std::string(kRunCols) +
      " FROM (SELECT *, row_number() OVER "
      "(PARTITION BY tenant_id ORDER BY id) AS turn FROM (SELECT " +
      std::string(kRunCols) +
      " FROM runs r INDEXED BY runs_claimable WHERE r.status='queued' "
      "AND r.status IN ('queued','running') "
      "AND NOT EXISTS (SELECT 1 FROM runs p INDEXED BY runs_session_active "
      "  WHERE p.session_id=r.session_id "
      "  AND (p.status='queued' OR p.status='running' OR p.status='waiting_for_approval') "
      "  AND p.id<>r.id "
      "  AND (p.status<>'queued' OR p.id<r.id)) "
      "UNION ALL SELECT " +
      std::string(kRunCols) +
      " FROM runs INDEXED BY runs_claimable "
      "WHERE status='running' AND status IN ('queued','running') AND lease_expires_at<?)) "
      "ORDER BY turn, id LIMIT ?";
  // Most looks find nothing: two index probes say so without the query's temporary tables.
  static const std::string kAnySql =
      "SELECT EXISTS(SELECT 1 FROM runs INDEXED BY runs_claimable WHERE status='queued' AND "
      "status IN ('queued','running')) OR EXISTS(SELECT 1 FROM runs INDEXED BY runs_claimable "
      "WHERE status='running' AND status IN ('queued','running') AND lease_expires_at<?)";
  KEEL_ASSIGN_OR_RETURN(auto any, db_.Prepare(kAnySql));
  any.BindAll(now);
  KEEL_ASSIGN_OR_RETURN(bool found, any.Step());
  if (!found || any.Int(0) == 0) return std::vector<Run>{};
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(now, limit);
  return Collect<Run>(s, ReadRun<Stmt>);
}

Status SqliteTx::ExpireLeasesOf(const std::string& owner) {
  static const std::string kSql = "UPDATE runs SET lease_expires_at=0 WHERE "
                                            "status='running' AND lease_owner=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s.BindAll(owner).Run();
}

Status SqliteTx::RenewLeases(const std::string& owner, const std::vector<std::string>& run_ids,
                             Millis expires_at) {
  static const std::string kSql = "UPDATE runs SET lease_expires_at=? WHERE id=? AND "
                                            "lease_owner=? AND status='running'";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  for (const auto& id : run_ids) {
    KEEL_RETURN_IF_ERROR(s.BindAll(expires_at, id, owner).Run());
  }
  return Status::Ok();
}

// ---- EventLog

Status SqliteTx::Append(NewEvent n) {
  Event& e = NewAppended(std::move(n));
  // As stored: with the row images the unit carried (the Json payload handed to live streams
  // leaves them out).
  std::string payload = DumpJson(e.payload);
  if (Status carried = AppendCarried(payload); !carried.ok()) {
    appended_.pop_back();
    return carried;
  }
  const ChainedFields chained = ChainedOf(e, payload);
  auto hash = sealer_.Next(chained, head_loader_);
  // The tenant's next position and the origin's next origin_seq: kept by this Tx, the store's
  // only writer, between units and transactions (KeptNumbers), and read from the table (one
  // probe of its unique index) only the first time. A rolled back unit takes its numbers with
  // it, so there is never a gap; the one writer makes them follow commit order. `position`
  // stays the store-wide key, which no client sees.
  static const std::string kLastPosition =
      "SELECT coalesce(max(tenant_position),0) FROM events WHERE tenant_id=?1";
  static const std::string kLastSeq =
      "SELECT coalesce(max(origin_seq),0) FROM events WHERE tenant_id=?1 AND origin=?2";
  static const std::string kSql =
      "INSERT INTO events(id, tenant_id, tenant_position, type, origin, origin_seq, agent_id, "
      "session_id, run_id, payload, occurred_at, hash) VALUES(?,?,?,?,?,?,?,?,?,?,?,?)";
  // The last number a query of the table gives (a max() over an index: always one row).
  auto last = [](Result<Stmt> s) -> Result<int64_t> {
    if (!s.ok()) return s.status();
    KEEL_ASSIGN_OR_RETURN(bool row, s->Step());
    if (!row) return Internal("the event's positions were not read");
    return s->Int(0);
  };
  const std::string seq_key = e.tenant_id + '\n' + e.origin;
  Status st = hash.status();
  int64_t tenant_position = 0;
  if (st.ok()) {
    auto next = numbers_.Next(e.tenant_id, [&] {
      auto s = db_.Prepare(kLastPosition);
      if (s.ok()) s->BindAll(e.tenant_id);
      return last(std::move(s));
    });
    auto seq = next.ok() ? numbers_.Next(seq_key,
                                         [&] {
                                           auto s = db_.Prepare(kLastSeq);
                                           if (s.ok()) s->BindAll(e.tenant_id, e.origin);
                                           return last(std::move(s));
                                         })
                         : Result<int64_t>(next.status());
    if (!seq.ok()) {
      st = seq.status();
    } else {
      tenant_position = *next;
      e.origin_seq = *seq;
    }
  }
  if (st.ok()) {
    auto s = db_.Prepare(kSql);
    st = s.ok() ? s->Borrowing()
                      .BindAll(e.id, e.tenant_id, tenant_position, e.type, e.origin, e.origin_seq,
                               e.agent_id, e.session_id, e.run_id, payload, e.occurred_at, *hash)
                      .Run()
                : s.status();
  }
  if (st.ok()) {
    e.position = tenant_position;
    numbers_.Used(e.tenant_id, tenant_position);
    numbers_.Used(seq_key, e.origin_seq);
    sealer_.Appended(chained, *hash, e.origin_seq);
  }
  if (!st.ok()) appended_.pop_back();
  return st;
}

// ---- The audit chain (store/audit.h)

Result<std::optional<ChainHead>> SqliteTx::LoadChainHead(const std::string& tenant_id,
                                                         const std::string& origin) {
  static const std::string kHead =
      "SELECT last_id, last_seq, hash, anchor, mac FROM audit_heads WHERE tenant_id=? AND origin=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kHead));
  s.BindAll(tenant_id, origin);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (row) {
    return std::optional<ChainHead>(
        ChainHead{tenant_id, origin, s.Text(0), s.Int(1), s.Text(2), s.Text(3), s.Text(4)});
  }
  // No head: a chain without events, or one whose head was removed (its last hashed event
  // carries it on, unsigned, so the sealer marks it).
  static const std::string kLast =
      "SELECT id, origin_seq, hash FROM events WHERE tenant_id=? AND origin=? AND hash<>'' "
      "ORDER BY origin_seq DESC LIMIT 1";
  KEEL_ASSIGN_OR_RETURN(auto last, db_.Prepare(kLast));
  last.BindAll(tenant_id, origin);
  KEEL_ASSIGN_OR_RETURN(bool found, last.Step());
  if (!found) return std::optional<ChainHead>();
  return std::optional<ChainHead>(
      ChainHead{tenant_id, origin, last.Text(0), last.Int(1), last.Text(2), "", ""});
}

Status SqliteTx::WriteChainHeads() {
  static const std::string kSql =
      "INSERT INTO audit_heads(tenant_id, origin, last_id, last_seq, hash, anchor, mac) "
      "VALUES(?,?,?,?,?,?,?) ON CONFLICT(tenant_id, origin) DO UPDATE SET last_id=excluded.last_id, "
      "last_seq=excluded.last_seq, hash=excluded.hash, anchor=excluded.anchor, mac=excluded.mac";
  for (const ChainHead& h : sealer_.Heads()) {
    KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
    KEEL_RETURN_IF_ERROR(
        s.BindAll(h.tenant_id, h.origin, h.last_id, h.last_seq, h.hash, h.anchor, h.mac).Run());
  }
  return Status::Ok();
}

Status SqliteTx::BackfillChains() {
  static const std::string kSql =
      "SELECT position, id, tenant_id, type, origin, origin_seq, agent_id, session_id, run_id, "
      "payload, occurred_at FROM events WHERE hash='' ORDER BY position";
  static const std::string kSet = "UPDATE events SET hash=? WHERE position=?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  std::vector<std::pair<Event, std::string>> unhashed;  // with the payload's stored text
  while (true) {
    KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    unhashed.emplace_back(ReadEventHead(s), s.Text(9));
  }
  for (const auto& [e, payload] : unhashed) {
    const ChainedFields chained = ChainedOf(e, payload);
    KEEL_ASSIGN_OR_RETURN(std::string hash, sealer_.Next(chained, head_loader_));
    KEEL_ASSIGN_OR_RETURN(auto set, db_.Prepare(kSet));
    KEEL_RETURN_IF_ERROR(set.BindAll(hash, e.position).Run());
    sealer_.Appended(chained, hash, e.origin_seq);
  }
  return Status::Ok();
}

// ---- ExportStore

Status SqliteTx::ExportTable(const std::string& tenant_id, const std::string& table,
                             const std::function<Status(const Json& row)>& emit) {
  KEEL_ASSIGN_OR_RETURN(const ExportTableSpec* spec, ExportTableOf(table));
  const std::string tenant_col = table == "tenants" ? "id" : "tenant_id";
  std::string sql = "SELECT " + ColumnList(*spec) + " FROM " + spec->name + " WHERE (?1='' OR " +
                    tenant_col + "=?1) ORDER BY " + spec->order_by;
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(sql));
  s.BindAll(tenant_id);
  while (true) {
    KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    Json out = Json::object();
    for (int i = 0; i < static_cast<int>(spec->columns.size()); ++i) {
      const ExportColumn& c = spec->columns[i];
      if (c.type == ColumnType::kText) {
        out[c.name] = s.Text(i);
      } else if (s.IsNull(i)) {
        out[c.name] = nullptr;
      } else {
        out[c.name] = s.Int(i);
      }
    }
    KEEL_RETURN_IF_ERROR(emit(out));
  }
  return Status::Ok();
}

Status SqliteTx::ImportRow(const std::string& table, const Json& row) {
  KEEL_ASSIGN_OR_RETURN(const ExportTableSpec* spec, ExportTableOf(table));
  KEEL_RETURN_IF_ERROR(CheckExportRow(*spec, row));
  if (table == "events") numbers_.Forget();  // numbered behind the kept numbers
  std::string marks;
  for (size_t i = 0; i < spec->columns.size(); ++i) marks += i ? ",?" : "?";
  // An explicit events.position also moves AUTOINCREMENT's counter (sqlite_sequence).
  std::string sql = "INSERT INTO " + std::string(spec->name) + "(" + ColumnList(*spec) +
                    ") VALUES(" + marks + ")";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(sql));
  for (int i = 0; i < static_cast<int>(spec->columns.size()); ++i) {
    const Json& v = row.at(spec->columns[i].name);
    if (v.is_null()) {
      s.BindNull(i + 1);
    } else if (v.is_string()) {
      s.Bind(i + 1, v.get_ref<const std::string&>());
    } else {
      s.Bind(i + 1, v.get<int64_t>());
    }
  }
  return s.Run();
}

// Store-wide positions come from AUTOINCREMENT, tenants' positions and origin_seqs from max():
// nothing to move.
// Imported memories get their search scope (not part of the archive).
// Events of an archive from before the audit chain are hashed here, and the chains' heads
// written at the unit's commit.
Status SqliteTx::FinishImport() {
  sealer_.Forget();
  numbers_.Forget();
  KEEL_RETURN_IF_ERROR(BackfillChains());
  return ScopeImportedMemories();
}

Result<bool> SqliteTx::IsEmpty() {
  std::vector<std::string> tables;
  for (const auto& t : ExportTables()) tables.emplace_back(t.name);
  for (const char* t : RuntimeTables()) tables.emplace_back(t);
  for (const std::string& t : tables) {
    KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare("SELECT 1 FROM " + t + " LIMIT 1"));
    KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
    if (row) return false;
  }
  return true;
}

Result<std::vector<Schedule>> SqliteTx::DueSchedules(Millis now, int limit) {
  static const std::string kSql = "SELECT " + std::string(kScheduleCols) +
                                  " FROM schedules WHERE status='active' AND next_fire_at<=? "
                                  "ORDER BY next_fire_at, id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(now, limit);
  return Collect<Schedule>(s, ReadSchedule<Stmt>);
}

Result<std::optional<Millis>> SqliteTx::NextFireAt() {
  static const std::string kSql = "SELECT min(next_fire_at) FROM schedules WHERE status='active'";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<Millis>();
  return s.OptInt(0);
}

Result<std::vector<IntrospectionDue>> SqliteTx::DueIntrospections(Millis now, int limit) {
  static const std::string kSql =
      "SELECT tenant_id, session_id, agent_id, due_at FROM introspection_due WHERE due_at<=? "
      "ORDER BY due_at, session_id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(now, limit);
  std::vector<IntrospectionDue> out;
  while (true) {
    KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back({s.Text(0), s.Text(1), s.Text(2), s.Int(3)});
  }
  return out;
}

namespace {

// The conversation after the message whose id is `after_id` (SQL: a parameter, or a query) and
// after seq ?3, at most `limit` (a parameter) messages; ?1 the session, ?2 the tenant. After
// the compaction's message (its seq, one probe of the primary key) and after_seq, through the
// seq index.
std::string ConversationSql(const std::string& after_id, const char* limit) {
  return "SELECT " + std::string(kConversationCols) +
         " FROM messages WHERE session_id=?1 AND tenant_id=?2 AND seq>?3 AND "
         "seq>coalesce((SELECT seq FROM messages WHERE tenant_id=?2 AND session_id=?1 AND id=" +
         after_id + "), 0) AND role IN ('user','assistant') ORDER BY seq LIMIT " + limit;
}

}  // namespace

template <typename... Args>
Result<Conversation> SqliteTx::ReadConversation(const std::string& sql,
                                                const std::string& tenant_id,
                                                const std::string& session_id, int64_t after_seq,
                                                const Args&... rest) {
  Conversation out;
  static const std::string kLast =
      "SELECT coalesce(max(seq), 0) FROM messages WHERE session_id=? AND tenant_id=?";
  KEEL_ASSIGN_OR_RETURN(auto last, db_.Prepare(kLast));
  last.BindAll(session_id, tenant_id);
  KEEL_ASSIGN_OR_RETURN(bool row, last.Step());
  out.last_seq = row ? last.Int(0) : 0;
  if (out.last_seq <= after_seq) return out;
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(sql));
  s.BindAll(session_id, tenant_id, after_seq, rest...);
  KEEL_ASSIGN_OR_RETURN(out.messages, Collect<Message>(s, ReadConversationMessage<Stmt>));
  return out;
}

Result<Conversation> SqliteTx::ConversationSince(const std::string& tenant_id,
                                                 const std::string& session_id,
                                                 const std::string& after_id, int64_t after_seq,
                                                 int limit) {
  static const std::string kSql = ConversationSql("?4", "?5");
  return ReadConversation(kSql, tenant_id, session_id, after_seq, after_id, limit);
}

Result<Conversation> SqliteTx::ConversationSinceLatest(const std::string& tenant_id,
                                                       const std::string& session_id,
                                                       int64_t after_seq, int limit) {
  static const std::string kSql = ConversationSql(
      "(SELECT last_message_id FROM compactions WHERE tenant_id=?2 AND session_id=?1 ORDER BY "
      "id DESC LIMIT 1)",
      "?4");
  return ReadConversation(kSql, tenant_id, session_id, after_seq, limit);
}

Result<int64_t> SqliteTx::PruneCache(Millis before, int64_t max_entries) {
  static const std::string kExpired = "DELETE FROM model_cache WHERE created_at<?";
  static const std::string kOldest =
      "DELETE FROM model_cache WHERE rowid IN (SELECT rowid FROM model_cache "
      "ORDER BY created_at DESC LIMIT -1 OFFSET ?)";
  int64_t deleted = 0;
  {
    KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kExpired));
    KEEL_RETURN_IF_ERROR(s.BindAll(before).Run());
    deleted += sqlite3_changes(db_.raw());
  }
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kOldest));
  KEEL_RETURN_IF_ERROR(s.BindAll(max_entries).Run());
  deleted += sqlite3_changes(db_.raw());
  return deleted;
}

}  // namespace keel::store::sqlite
