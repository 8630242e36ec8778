#include "keel/store/postgres/postgres_tx.h"

#include <algorithm>

#include "keel/common/ids.h"
#include "keel/store/compaction_rows.h"
#include "keel/store/row_images.h"
#include "keel/store/rows.h"
#include "keel/store/schedule_rows.h"

namespace keel::store::postgres {
namespace {

using namespace rows;  // NOLINT: the shared record readers

// A text[] literal for a parameter: {"a","b"} with quotes and backslashes escaped.
std::string TextArray(const std::vector<std::string>& items) {
  std::string out = "{";
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += ',';
    out += '"';
    for (char c : items[i]) {
      if (c == '"' || c == '\\') out += '\\';
      out += c;
    }
    out += '"';
  }
  return out + "}";
}

}  // namespace

void PostgresTx::BeginTransaction(bool write) {
  appended_.clear();
  held_events_.clear();
  arrived_.clear();
  sql_.BeginTransaction(write);
}

void PostgresTx::AfterRollbackToSavepoint() { sql_.UnitRolledBack(); }

Result<std::vector<std::pair<std::string, Rows>>> PostgresTx::RowsOfKeys(const Rows& keys,
                                                                          const std::string& sql) {
  std::vector<std::pair<std::string, std::vector<std::string>>> by_tenant;
  for (int i = 0; i < keys.size(); ++i) {
    const std::string tenant = keys.Text(i, 0);
    auto it = std::find_if(by_tenant.begin(), by_tenant.end(),
                           [&](const auto& t) { return t.first == tenant; });
    if (it == by_tenant.end()) it = by_tenant.insert(by_tenant.end(), {tenant, {}});
    it->second.push_back(keys.Text(i, 1));
  }
  std::vector<std::pair<std::string, Rows>> out;
  for (const auto& [tenant, ids] : by_tenant) {
    KEEL_RETURN_IF_ERROR(BindTenant(tenant));
    KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(sql, P(tenant, TextArray(ids))));
    out.emplace_back(tenant, std::move(rows));
  }
  return out;
}

// ---- TenantStore

Result<std::vector<Tenant>> PostgresTx::ListTenants() {
  static const std::string kSql =
      "SELECT " + std::string(kTenantCols) + " FROM keel_tenants() ORDER BY id COLLATE \"C\"";
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, Params()));
  return Collect<Tenant>(rows, ReadTenant<Row>);
}

// ---- TokenStore

Result<Token> PostgresTx::FindActiveTokenByHash(const std::string& hash) {
  static const std::string kSql =
      "SELECT " + std::string(kTokenCols) + " FROM keel_active_token($1)";
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(hash)));
  return One<Token>(rows, ReadToken<Row>, "token not found");
}

// ---- ChannelStore

Result<std::string> PostgresTx::ChannelTenant(const std::string& id) {
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query("SELECT keel_channel_tenant($1)", P(id)));
  if (rows.empty() || rows.IsNull(0, 0)) return NotFound("channel not found: " + id);
  return rows.Text(0, 0);
}

Result<std::vector<Channel>> PostgresTx::PolledChannels() {
  static const std::string kKeys = "SELECT tenant_id, id FROM keel_polled_channels()";
  static const std::string kSql = "SELECT " + std::string(kChannelCols) +
                                  " FROM channels WHERE tenant_id=$1 AND id = ANY($2::text[])";
  KEEL_ASSIGN_OR_RETURN(auto keys, conn_.Query(kKeys, Params()));
  KEEL_ASSIGN_OR_RETURN(auto found, RowsOfKeys(keys, kSql));
  return InKeyOrder<Channel>(keys, found, ReadChannel<Row>);
}

Result<std::vector<ChannelLease>> PostgresTx::ChannelLeases() {
  KEEL_ASSIGN_OR_RETURN(
      auto rows,
      conn_.Query(
          "SELECT tenant_id, channel_id, holder, held_until, bot FROM keel_channel_leases()",
          Params()));
  std::vector<ChannelLease> out;
  out.reserve(rows.size());
  for (int i = 0; i < rows.size(); ++i) {
    out.push_back(
        {rows.Text(i, 0), rows.Text(i, 1), rows.Text(i, 2), rows.Int(i, 3), rows.Text(i, 4)});
  }
  return out;
}

Result<std::vector<ChannelReply>> PostgresTx::DueReplies(Millis now, const std::string& origin,
                                                         int limit) {
  static const std::string kKeys = "SELECT tenant_id, id FROM keel_due_replies($1, $2, $3)";
  static const std::string kSql =
      "SELECT " + std::string(kReplyCols) +
      " FROM channel_replies WHERE tenant_id=$1 AND id = ANY($2::text[])";
  KEEL_ASSIGN_OR_RETURN(auto keys, conn_.Query(kKeys, P(now, origin, PgSql::Limit(limit))));
  KEEL_ASSIGN_OR_RETURN(auto found, RowsOfKeys(keys, kSql));
  return InKeyOrder<ChannelReply>(keys, found, ReadReply<Row>);
}

Result<std::vector<std::pair<std::string, std::string>>> PostgresTx::ApprovalsToCard(int limit) {
  KEEL_ASSIGN_OR_RETURN(
      auto rows,
      conn_.Query("SELECT tenant_id, id FROM keel_approvals_to_card($1)", P(PgSql::Limit(limit))));
  std::vector<std::pair<std::string, std::string>> out;
  for (int i = 0; i < rows.size(); ++i) out.emplace_back(rows.Text(i, 0), rows.Text(i, 1));
  return out;
}

// ---- RunStore

Result<int64_t> PostgresTx::CountQueuedRuns() {
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query("SELECT keel_queued_runs()", Params()));
  return rows.empty() || rows.IsNull(0, 0) ? 0 : rows.Int(0, 0);
}

Result<std::vector<NodeInfo>> PostgresTx::ListNodes(Millis within_ms) {
  KEEL_ASSIGN_OR_RETURN(
      auto rows,
      conn_.Query("SELECT origin, address, started_at, seen_at, runs_executing, runs_finished, "
                  "leader::int FROM keel_nodes($1)",
                  P(within_ms)));
  std::vector<NodeInfo> nodes;
  for (int i = 0; i < rows.size(); ++i) {
    NodeInfo n;
    n.origin = rows.Text(i, 0);
    n.address = rows.Text(i, 1);
    n.started_at = rows.Int(i, 2);
    n.seen_at = rows.Int(i, 3);
    n.runs_executing = rows.Int(i, 4);
    n.runs_finished = rows.Int(i, 5);
    n.leader = rows.Int(i, 6) != 0;
    nodes.push_back(std::move(n));
  }
  return nodes;
}

// ---- ApprovalStore

Result<std::vector<Approval>> PostgresTx::ExpiredApprovals(Millis now, int limit) {
  static const std::string kKeys = "SELECT tenant_id, id FROM keel_expired_approvals($1, $2)";
  static const std::string kSql = "SELECT " + std::string(kApprovalCols) +
                                  " FROM approvals WHERE tenant_id=$1 AND id = ANY($2::text[])";
  KEEL_ASSIGN_OR_RETURN(auto keys, conn_.Query(kKeys, P(now, PgSql::Limit(limit))));
  KEEL_ASSIGN_OR_RETURN(auto found, RowsOfKeys(keys, kSql));
  return InKeyOrder<Approval>(keys, found, ReadApproval<Row>);
}

// ---- PluginStore

Result<std::vector<PluginDelivery>> PostgresTx::DueDeliveries(Millis now, int limit) {
  static const std::string kKeys = "SELECT tenant_id, id FROM keel_due_deliveries($1, $2)";
  static const std::string kSql =
      "SELECT " + std::string(kDeliveryCols) +
      " FROM plugin_deliveries WHERE tenant_id=$1 AND id = ANY($2::text[])";
  KEEL_ASSIGN_OR_RETURN(auto keys, conn_.Query(kKeys, P(now, PgSql::Limit(limit))));
  KEEL_ASSIGN_OR_RETURN(auto found, RowsOfKeys(keys, kSql));
  return InKeyOrder<PluginDelivery>(keys, found, ReadDelivery<Row>);
}

// ---- RunStore

Result<bool> PostgresTx::SessionBusy(const std::string& tenant_id, const std::string& session_id) {
  static const std::string kSql =
      "SELECT 1 FROM runs WHERE tenant_id=$1 AND session_id=$2 AND status IN "
      "('queued','running','waiting_for_approval') LIMIT 1";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, session_id)));
  return !rows.empty();
}

Result<RunStore::IntakeView> PostgresTx::ForIntake(const std::string& tenant_id,
                                                   const std::string& session_id) {
  static const std::string kSql =
      "SELECT " + std::string(kSessionCols) +
      ", EXISTS(SELECT 1 FROM runs WHERE tenant_id=$1 AND session_id=$2 AND status IN "
      "('queued','running','waiting_for_approval')), (SELECT count(*) FROM runs WHERE "
      "tenant_id=$1 AND status IN ('queued','running')) FROM sessions WHERE tenant_id=$1 AND id=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, session_id)));
  if (rows.empty()) return NotFound("session not found: " + session_id);
  Row row(rows, 0);
  IntakeView v;
  v.session = ReadSession(row);
  v.busy = row.Text(kSessionColCount) == "t";
  v.active_runs = row.Int(kSessionColCount + 1);
  return v;
}

Result<RunStore::IntakeRead> PostgresTx::ReadForIntake(const std::string& tenant_id,
                                                       const std::string& session_id) {
  static const std::string kSql =
      "SELECT " + Qualified(kSessionCols, "s") +
      ", EXISTS(SELECT 1 FROM runs WHERE tenant_id=$1 AND session_id=$2 AND status IN "
      "('queued','running','waiting_for_approval')), " +
      "coalesce((SELECT version FROM settings_versions WHERE tenant_id=$1), 0), " +
      Qualified(kAgentCols, "a") +
      " FROM sessions s LEFT JOIN agents a ON a.tenant_id=s.tenant_id AND a.id=s.agent_id AND "
      "a.status <> 'deleted' WHERE s.tenant_id=$1 AND s.id=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, session_id)));
  if (rows.empty()) return NotFound("session not found: " + session_id);
  Row row(rows, 0);
  IntakeRead out;
  out.session = ReadSession(row);
  out.busy = row.Text(kSessionColCount) == "t";
  out.settings_version = row.Int(kSessionColCount + 1);
  if (!rows.IsNull(0, kSessionColCount + 2)) {
    out.agent = ReadAgent(Shifted<Row>{row, kSessionColCount + 2});
  }
  return out;
}

Status PostgresTx::StartIdleSession(const std::string& tenant_id, const std::string& session_id,
                                    const std::string& agent_id, int64_t max_active, Millis at) {
  // ForIntake's conditions, checked by the update itself: pipelined, not waited for.
  static const std::string kSql =
      "UPDATE sessions SET status='running', updated_at=$3 WHERE tenant_id=$1 AND id=$2 AND "
      "agent_id=$4 AND status<>'inactive' AND NOT EXISTS(SELECT 1 FROM runs WHERE tenant_id=$1 "
      "AND session_id=$2 AND status IN ('queued','running','waiting_for_approval')) AND (SELECT "
      "count(*) FROM runs WHERE tenant_id=$1 AND status IN ('queued','running')) < $5";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  return sql_.ExecChanging(Conflict("session " + session_id + " changed since intake read it"),
                           kSql, tenant_id, session_id, at, agent_id, max_active);
}

Result<std::vector<Run>> PostgresTx::ClaimableRuns(Millis now, int limit) {
  static const std::string kKeys = "SELECT tenant_id, id FROM keel_claimable_runs($1, $2)";
  static const std::string kSql =
      "SELECT " + std::string(kRunCols) + " FROM runs WHERE tenant_id=$1 AND id = ANY($2::text[])";
  KEEL_ASSIGN_OR_RETURN(auto keys, conn_.Query(kKeys, P(now, PgSql::Limit(limit))));
  KEEL_ASSIGN_OR_RETURN(auto found, RowsOfKeys(keys, kSql));
  return InKeyOrder<Run>(keys, found, ReadRun<Row>);
}

Status PostgresTx::ExpireLeasesOf(const std::string& owner) {
  static const std::string kSql = "SELECT keel_expire_leases($1)";
  return conn_.Query(kSql, P(owner)).status();
}

Status PostgresTx::RenewLeases(const std::string& owner, const std::vector<std::string>& run_ids,
                               Millis expires_at) {
  static const std::string kSql = "SELECT keel_renew_leases($1, $2::text[], $3)";
  if (run_ids.empty()) return Status::Ok();
  return conn_.Query(kSql, P(owner, TextArray(run_ids), expires_at)).status();
}

// ---- EventLog

Status PostgresTx::Append(NewEvent n) {
  Event& e = NewAppended(std::move(n));
  // As stored: with the row images the unit carried (the Json payload handed to live streams
  // leaves them out).
  std::string payload = DumpJson(e.payload);
  if (Status carried = AppendCarried(payload); !carried.ok()) {
    appended_.pop_back();
    return carried;
  }
  const ChainedFields chained = ChainedOf(e, payload);
  // Bound now, so the tenant's write lock is taken where the unit asks for it (PgSql).
  Status st = BindTenant(e.tenant_id);
  Result<std::string> hash = st.ok() ? sealer_.Next(chained, head_loader_) : Result<std::string>(st);
  if (!hash.ok()) {
    appended_.pop_back();
    return hash.status();
  }
  sealer_.Appended(chained, *hash);
  held_events_.push_back(HeldEvent{appended_.size() - 1, std::move(payload), std::move(*hash)});
  return Status::Ok();
}

Status PostgresTx::SendEvents() {
  // The tenant's position and the origin's origin_seq are computed inside the insert, one
  // probe of each unique index for all the events of a tenant and origin, numbered in append
  // order (SqliteTx reads them first and binds them; the rule is the same): a rolled back unit
  // takes its numbers with it, so there is never a gap, and since every write transaction holds
  // its tenant's write lock (PgSql, docs/decisions/0014), they follow commit order within the
  // tenant. `position` stays the store-wide key, in no useful order.
  static const std::string kSql =
      "INSERT INTO events(id, tenant_id, tenant_position, type, origin, origin_seq, agent_id, "
      "session_id, run_id, payload, occurred_at, hash) "
      "SELECT v.id, $1, last.position + v.n, v.type, $2, last.seq + v.n, v.agent_id, "
      "v.session_id, v.run_id, v.payload, v.occurred_at, v.hash "
      "FROM (SELECT (SELECT coalesce(max(tenant_position), 0) FROM events WHERE tenant_id=$1) "
      "AS position, (SELECT coalesce(max(origin_seq), 0) FROM events WHERE tenant_id=$1 AND "
      "origin=$2) AS seq) last, "
      "unnest($3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], "
      "$9::bigint[], $10::text[]) WITH ORDINALITY "
      "AS v(id, type, agent_id, session_id, run_id, payload, occurred_at, hash, n) "
      "ORDER BY v.n RETURNING id, tenant_position, origin_seq";
  if (held_events_.empty()) return Status::Ok();
  std::vector<HeldEvent> held = std::move(held_events_);
  held_events_.clear();
  // Sent before one of the unit's statements, perhaps for another tenant: bound back after.
  const std::optional<std::string> bound = sql_.bound_tenant();
  for (size_t first = 0; first < held.size();) {
    const Event& head = appended_[held[first].index];
    size_t end = first + 1;
    while (end < held.size() && appended_[held[end].index].tenant_id == head.tenant_id &&
           appended_[held[end].index].origin == head.origin) {
      ++end;
    }
    std::vector<std::string> ids, types, agents, sessions, runs, payloads, times, hashes;
    std::vector<size_t> indexes;
    for (size_t i = first; i < end; ++i) {
      Event& e = appended_[held[i].index];
      ids.push_back(e.id);
      types.push_back(e.type);
      agents.push_back(e.agent_id);
      sessions.push_back(e.session_id);
      runs.push_back(e.run_id);
      payloads.push_back(std::move(held[i].payload));
      times.push_back(std::to_string(e.occurred_at));
      hashes.push_back(std::move(held[i].hash));
      indexes.push_back(held[i].index);
    }
    // Row security checks each row against the tenant bound now (its lock was taken at
    // Append). Pipelined: the positions arrive with the next round trip, at the latest before
    // the transaction commits (PostgresStore flushes then), perhaps after the unit's end; a
    // failure there fails the unit.
    KEEL_RETURN_IF_ERROR(BindTenant(head.tenant_id));
    KEEL_RETURN_IF_ERROR(
        conn_.Send(kSql,
                   P(head.tenant_id, head.origin, TextArray(ids), TextArray(types),
                     TextArray(agents), TextArray(sessions), TextArray(runs), TextArray(payloads),
                     TextArray(times), TextArray(hashes)),
                   [this, indexes = std::move(indexes), tenant = head.tenant_id,
                    origin = head.origin](Rows& rows) { Arrived(rows, indexes, tenant, origin); }));
    first = end;
  }
  return bound ? BindTenant(*bound) : Status::Ok();
}

void PostgresTx::Arrived(const Rows& rows, const std::vector<size_t>& indexes,
                         const std::string& tenant_id, const std::string& origin) {
  for (int r = 0; r < rows.size(); ++r) {
    const std::string id = rows.Text(r, 0);
    const int64_t position = rows.Int(r, 1);
    const int64_t seq = rows.Int(r, 2);
    // Still the unit's (the answer came with one of its reads), or taken with it since.
    for (size_t index : indexes) {
      if (index < appended_.size() && appended_[index].id == id) {
        appended_[index].position = position;
        appended_[index].origin_seq = seq;
      }
    }
    arrived_[id] = {position, seq};
    sealer_.SeqArrived(tenant_id, origin, id, seq);
  }
}

void PostgresTx::FillPositions(std::vector<Event>& events) const {
  for (Event& e : events) {
    if (auto it = arrived_.find(e.id); it != arrived_.end()) {
      e.position = it->second.first;
      e.origin_seq = it->second.second;
    }
  }
}

// ---- The audit chain (store/audit.h)

Result<std::optional<ChainHead>> PostgresTx::LoadChainHead(const std::string& tenant_id,
                                                           const std::string& origin) {
  static const std::string kHead =
      "SELECT last_id, last_seq, hash, anchor, mac FROM audit_heads "
      "WHERE tenant_id=$1 AND origin=$2";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto head, conn_.Query(kHead, P(tenant_id, origin)));
  if (!head.empty()) {
    return std::optional<ChainHead>(ChainHead{tenant_id, origin, head.Text(0, 0), head.Int(0, 1),
                                              head.Text(0, 2), head.Text(0, 3), head.Text(0, 4)});
  }
  // No head: a chain without events, or one whose head was removed (its last hashed event
  // carries it on, unsigned, so the sealer marks it).
  static const std::string kLast =
      "SELECT id, origin_seq, hash FROM events WHERE tenant_id=$1 AND origin=$2 AND hash<>'' "
      "ORDER BY origin_seq DESC LIMIT 1";
  KEEL_ASSIGN_OR_RETURN(auto last, conn_.Query(kLast, P(tenant_id, origin)));
  if (last.empty()) return std::optional<ChainHead>();
  return std::optional<ChainHead>(
      ChainHead{tenant_id, origin, last.Text(0, 0), last.Int(0, 1), last.Text(0, 2), "", ""});
}

Status PostgresTx::WriteChainHeads() {
  static const std::string kSql =
      "INSERT INTO audit_heads(tenant_id, origin, last_id, last_seq, hash, anchor, mac) "
      "VALUES($1,$2,$3,$4,$5,$6,$7) ON CONFLICT (tenant_id, origin) DO UPDATE SET "
      "last_id=EXCLUDED.last_id, last_seq=EXCLUDED.last_seq, hash=EXCLUDED.hash, "
      "anchor=EXCLUDED.anchor, mac=EXCLUDED.mac";
  for (const ChainHead& h : sealer_.Heads()) {
    KEEL_RETURN_IF_ERROR(BindTenant(h.tenant_id));
    KEEL_RETURN_IF_ERROR(
        conn_.Send(kSql, P(h.tenant_id, h.origin, h.last_id, h.last_seq, h.hash, h.anchor, h.mac)));
  }
  return Status::Ok();
}

Status PostgresTx::BackfillChains() {
  static const std::string kTenants = "SELECT tenant_id FROM keel_unhashed_tenants()";
  static const std::string kEvents =
      "SELECT position, id, tenant_id, type, origin, origin_seq, agent_id, session_id, run_id, "
      "payload, occurred_at FROM events WHERE tenant_id=$1 AND hash='' ORDER BY position";
  static const std::string kSet =
      "UPDATE events SET hash = v.hash FROM unnest($2::bigint[], $3::text[]) AS v(position, hash) "
      "WHERE events.tenant_id = $1 AND events.position = v.position";
  KEEL_ASSIGN_OR_RETURN(auto tenants, conn_.Query(kTenants, Params()));
  for (int t = 0; t < tenants.size(); ++t) {
    const std::string tenant = tenants.Text(t, 0);
    KEEL_RETURN_IF_ERROR(BindTenant(tenant));
    KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kEvents, P(tenant)));
    std::string positions = "{";
    std::string hashes = "{";
    for (int r = 0; r < rows.size(); ++r) {
      const Event e = ReadEventHead(Row(rows, r));
      const std::string payload = rows.Text(r, 9);
      const ChainedFields chained = ChainedOf(e, payload);
      KEEL_ASSIGN_OR_RETURN(std::string hash, sealer_.Next(chained, head_loader_));
      sealer_.Appended(chained, hash, e.origin_seq);
      positions += (r ? "," : "") + std::to_string(e.position);
      hashes += (r ? "," : "") + hash;  // hex: no quoting needed in an array literal
    }
    KEEL_RETURN_IF_ERROR(BindTenant(tenant));
    KEEL_RETURN_IF_ERROR(conn_.Query(kSet, P(tenant, positions + "}", hashes + "}")).status());
  }
  return Status::Ok();
}

// ---- ExportStore

// Each tenant's rows are read bound to it. All tenants' rows (`tenant_id` empty) are every
// tenant's in turn, merged into the table's order: the runtime role has no wider view.
Status PostgresTx::ExportTable(const std::string& tenant_id, const std::string& table,
                               const std::function<Status(const Json& row)>& emit) {
  KEEL_ASSIGN_OR_RETURN(const ExportTableSpec* spec, ExportTableOf(table));
  const std::string tenant_col = table == "tenants" ? "id" : "tenant_id";
  const std::string sql = "SELECT " + ColumnList(*spec) + " FROM " + spec->name + " WHERE " +
                          tenant_col + "=$1 ORDER BY " + spec->order_by;
  std::vector<std::string> tenants;
  if (tenant_id.empty()) {
    KEEL_ASSIGN_OR_RETURN(auto all, ListTenants());
    for (auto& t : all) tenants.push_back(std::move(t.id));
  } else {
    tenants.push_back(tenant_id);
  }
  std::vector<Json> out;
  for (const auto& tenant : tenants) {
    KEEL_RETURN_IF_ERROR(BindTenant(tenant));
    KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(sql, P(tenant)));
    for (int r = 0; r < rows.size(); ++r) {
      Json row = Json::object();
      for (int i = 0; i < static_cast<int>(spec->columns.size()); ++i) {
        const ExportColumn& c = spec->columns[i];
        if (c.type == ColumnType::kText) {
          row[c.name] = rows.Text(r, i);
        } else if (rows.IsNull(r, i)) {
          row[c.name] = nullptr;
        } else {
          row[c.name] = rows.Int(r, i);
        }
      }
      out.push_back(std::move(row));
    }
  }
  if (tenants.size() > 1) {
    // order_by names key columns ("tenant_id, id", "position"): never null; text in byte order
    // as COLLATE "C" sorts it.
    std::vector<std::string> keys;
    std::string rest = spec->order_by;
    for (size_t at = 0; at != std::string::npos;) {
      size_t comma = rest.find(',', at);
      std::string key = rest.substr(at, comma == std::string::npos ? comma : comma - at);
      key.erase(0, key.find_first_not_of(' '));
      key.erase(key.find_last_not_of(' ') + 1);
      keys.push_back(key);
      at = comma == std::string::npos ? comma : comma + 1;
    }
    std::stable_sort(out.begin(), out.end(), [&](const Json& a, const Json& b) {
      for (const auto& k : keys) {
        const Json& x = a.at(k);
        const Json& y = b.at(k);
        if (x == y) continue;
        return x < y;
      }
      return false;
    });
  }
  for (const auto& row : out) KEEL_RETURN_IF_ERROR(emit(row));
  return Status::Ok();
}

// Every row, tenants' too, is inserted bound to its tenant; events keep their store-wide
// position (OVERRIDING SYSTEM VALUE; FinishImport moves the identity).
Status PostgresTx::ImportRow(const std::string& table, const Json& row) {
  KEEL_ASSIGN_OR_RETURN(const ExportTableSpec* spec, ExportTableOf(table));
  KEEL_RETURN_IF_ERROR(CheckExportRow(*spec, row));
  const std::string sql = "INSERT INTO " + std::string(spec->name) + "(" + ColumnList(*spec) + ")" +
                          (table == "events" ? " OVERRIDING SYSTEM VALUE" : "") + " VALUES(" +
                          Placeholders(static_cast<int>(spec->columns.size())) + ")";
  Params params;
  for (const auto& c : spec->columns) {
    const Json& v = row.at(c.name);
    if (v.is_null()) {
      params.Add(std::optional<int64_t>());
    } else if (v.is_string()) {
      params.Add(v.get_ref<const std::string&>());
    } else {
      params.Add(v.get<int64_t>());
    }
  }
  KEEL_RETURN_IF_ERROR(
      BindTenant(row.at(table == "tenants" ? "id" : "tenant_id").get<std::string>()));
  return conn_.Query(sql, params).status();
}

// Events of an archive from before the audit chain are hashed here, and the chains' heads
// written at the unit's commit.
Status PostgresTx::FinishImport() {
  KEEL_RETURN_IF_ERROR(conn_.Query("SELECT keel_finish_import()", Params()).status());
  sealer_.Forget();
  return BackfillChains();
}

Result<bool> PostgresTx::IsEmpty() {
  static const std::string kSql = "SELECT keel_table_is_empty($1)";
  std::vector<std::string> tables;
  for (const auto& t : ExportTables()) tables.emplace_back(t.name);
  for (const char* t : RuntimeTables()) tables.emplace_back(t);
  for (const std::string& t : tables) {
    KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(t)));
    if (rows.empty() || rows.Text(0, 0) != "t") return false;
  }
  return true;
}

// The two runtime-wide reads: the owner's functions give the due schedules' keys (read here
// bound to their tenants) and the earliest time.
Result<std::vector<Schedule>> PostgresTx::DueSchedules(Millis now, int limit) {
  static const std::string kKeys = "SELECT tenant_id, id FROM keel_due_schedules($1, $2)";
  static const std::string kSql = "SELECT " + std::string(kScheduleCols) +
                                  " FROM schedules WHERE tenant_id=$1 AND id = ANY($2::text[])";
  KEEL_ASSIGN_OR_RETURN(auto keys,
                        conn_.Query(kKeys, P(now, static_cast<int64_t>(std::max(limit, 0)))));
  KEEL_ASSIGN_OR_RETURN(auto found, RowsOfKeys(keys, kSql));
  return InKeyOrder<Schedule>(keys, found, ReadSchedule<Row>);
}

Result<std::optional<Millis>> PostgresTx::NextFireAt() {
  static const std::string kSql = "SELECT keel_next_fire_at()";
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, Params()));
  if (rows.empty()) return std::optional<Millis>();
  return rows.OptInt(0, 0);
}

// Runtime-wide: the owner's function returns exactly these four columns.
Result<std::vector<IntrospectionDue>> PostgresTx::DueIntrospections(Millis now, int limit) {
  static const std::string kSql =
      "SELECT tenant_id, session_id, agent_id, due_at FROM keel_due_introspections($1, $2)";
  auto rows = conn_.Query(kSql, P(now, static_cast<int64_t>(limit)));
  if (!rows.ok()) return rows.status();
  std::vector<IntrospectionDue> out;
  for (int i = 0; i < rows->size(); ++i) {
    out.push_back({rows->Text(i, 0), rows->Text(i, 1), rows->Text(i, 2), rows->Int(i, 3)});
  }
  return out;
}

namespace {

// One statement: the newest seq in every row, and a row of NULLs when there is nothing new, so
// that the newest seq still comes back. After the message whose id is `after_id` (SQL: a
// parameter, or a query) and after seq $3, at most `limit` (a parameter); $1 the tenant, $2 the
// session. After the compaction's message (its seq, one probe of the primary key) and
// after_seq, through the seq index.
std::string ConversationSql(const std::string& after_id, const char* limit) {
  return "WITH last AS (SELECT coalesce(max(seq), 0) AS seq FROM messages "
         "WHERE session_id=$2 AND tenant_id=$1), "
         "conv AS (SELECT " +
         std::string(kConversationCols) +
         " FROM messages WHERE tenant_id=$1 AND session_id=$2 AND seq>$3 AND "
         "seq>coalesce((SELECT seq FROM messages WHERE tenant_id=$1 AND session_id=$2 AND id=" +
         after_id + "), 0) AND role IN ('user','assistant') ORDER BY seq LIMIT " + limit +
         ") SELECT conv.id, conv.role, conv.content, conv.seq, last.seq FROM last "
         "LEFT JOIN conv ON true ORDER BY conv.seq";
}

Conversation ReadConversationRows(const Rows& rows) {
  Conversation out;
  for (int i = 0; i < rows.size(); ++i) {
    out.last_seq = rows.Int(i, 4);
    if (rows.IsNull(i, 0)) continue;
    out.messages.push_back(ReadConversationMessage<Row>(Row(rows, i)));
  }
  return out;
}

}  // namespace

Result<Conversation> PostgresTx::ConversationSince(const std::string& tenant_id,
                                                   const std::string& session_id,
                                                   const std::string& after_id, int64_t after_seq,
                                                   int limit) {
  static const std::string kSql = ConversationSql("$4", "$5");
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, session_id, after_seq, after_id,
                                                       static_cast<int64_t>(limit))));
  return ReadConversationRows(rows);
}

Result<Conversation> PostgresTx::ConversationSinceLatest(const std::string& tenant_id,
                                                         const std::string& session_id,
                                                         int64_t after_seq, int limit) {
  static const std::string kSql = ConversationSql(
      "(SELECT last_message_id FROM compactions WHERE tenant_id=$1 AND session_id=$2 ORDER BY "
      "id DESC LIMIT 1)",
      "$4");
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, session_id, after_seq,
                                                       static_cast<int64_t>(limit))));
  return ReadConversationRows(rows);
}

// Runtime-wide: the owner's function deletes across tenants and returns only the count.
Result<int64_t> PostgresTx::PruneCache(Millis before, int64_t max_entries) {
  static const std::string kSql = "SELECT keel_prune_cache($1, $2)";
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(before, max_entries)));
  return rows.empty() ? 0 : rows.Int(0, 0);
}

}  // namespace keel::store::postgres
