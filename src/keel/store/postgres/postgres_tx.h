#pragma once
// PostgresTx: every storage port on one PostgreSQL connection, most of them written once for
// both backends in store/sql_tx.h, with the same answers and error codes as SqliteTx. One
// PostgresTx is bound to one Conn for its lifetime and reused across transactions on that
// connection; it is used by the thread that owns the connection only (the writer thread, or a
// reader holding it).
//
// Tenant binding (DESIGN.md invariant 6): the tenant-scoped tables enforce row-level security
// on `app.tenant_id`. Before a tenant-scoped call, the Tx sets it transaction-locally with
// set_config when the call names a tenant other than the one already bound in this transaction
// (so a unit that stays within one tenant pays for one set_config). The connection's role is the
// runtime role, which owns nothing (docs/decisions/0008-postgres-owner-and-runtime-roles.md): no
// setting shows it more than one tenant. The runtime-wide calls (FindActiveTokenByHash,
// ListTenants, ClaimableRuns, ExpireLeasesOf, RenewLeases, ExpiredApprovals,
// DueDeliveries, DueSchedules, NextFireAt, DueIntrospections, PruneCache, IsEmpty, FinishImport)
// call SECURITY DEFINER functions of the owner role that return keys, counts or times; the
// records behind the keys are then read bound to their tenant (RowsOfKeys). Every query still
// filters by tenant_id itself; the policies are the second line of defence.
//
// Invariants:
//   1. PgSql's bound tenant is the value of app.tenant_id in the open transaction, or nullopt
//      when it is not known (a new transaction, or a savepoint rolled back that may have
//      changed it).
//   2. A tenant's record is only ever read or written with app.tenant_id set to its tenant.
//   3. Inserts use ON CONFLICT DO NOTHING and report kConflict when nothing was inserted, so a
//      duplicate does not abort the transaction (a unit may go on, as it may with SQLite).

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "keel/store/postgres/pg_conn.h"
#include "keel/store/sql_tx.h"

namespace keel::store::postgres {

class PostgresTx final : public SqlTx<PgSql> {
 public:
  // `audit_key`: signs the chain heads this Tx writes (store/audit.h); "" unsigned.
  PostgresTx(Conn& conn, std::string origin, std::string audit_key)
      : SqlTx(PgSql(conn), std::move(origin), std::move(audit_key)), conn_(conn) {
    head_loader_ = [this](const std::string& tenant_id, const std::string& origin) {
      return LoadChainHead(tenant_id, origin);
    };
    conn_.SetBeforeWait([this] { return SendEvents(); });
  }
  ~PostgresTx() override { conn_.SetBeforeWait(nullptr); }
  PostgresTx(const PostgresTx&) = delete;
  PostgresTx& operator=(const PostgresTx&) = delete;

  // A transaction began: nothing from the previous one (settings, locks, events) carries over.
  // `write`: the writer's, which takes tenant write locks (PgSql); a read takes none.
  void BeginTransaction(bool write);
  // The tenant write locks of a write transaction (PgSql says how they are taken).
  Status LockFirst(const std::set<std::string>& tenants) { return sql_.LockFirst(tenants); }
  void WaitsAllowed() { sql_.WaitsAllowed(); }
  void BeginUnit() { sql_.BeginUnit(); }
  // Starts a new unit of work: also forgets the events a failed unit held back.
  void ResetUnit() {
    held_events_.clear();
    SqlTx::ResetUnit();
  }
  // The unit's events, held back by Append, go out as one insert per tenant and origin
  // (pipelined): at the unit's end, or before the connection next waits for the server (a read
  // in the unit). The unit's failure drops them.
  Status SendEvents();
  void DropEvents() { held_events_.clear(); }
  const std::string& busy_tenant() const { return sql_.busy(); }
  const std::set<std::string>& unit_tenants() const { return sql_.unit_tenants(); }
  // The transaction's first pipelined write that changed no row (PgSql::ExecChanging), once
  // its count arrived, marked with its unit.
  const Conn::Failure& unchanged() const { return sql_.unchanged(); }
  void ClearUnchanged() { sql_.ClearUnchanged(); }
  // Sets the positions and origin_seqs of `events` (taken from units whose inserts were
  // answered since: Flush first).
  void FillPositions(std::vector<Event>& events) const;
  // The unit's savepoint was rolled back, undoing the settings and locks it took.
  void AfterRollbackToSavepoint();
  // Before COMMIT: queues the upserts of the heads the transaction's units moved (COMMIT
  // flushes them, and fails with them).
  Status WriteChainHeads();
  // Hashes the events stored without a hash (written before the audit chain existed), in
  // position order, extending their chains; the heads are written with the unit's commit.
  Status BackfillChains();

  // The ports SqlTx leaves to the dialect.
  // TenantStore
  Result<std::vector<Tenant>> ListTenants() override;
  // TokenStore
  Result<Token> FindActiveTokenByHash(const std::string& hash) override;
  // ChannelStore
  Result<std::string> ChannelTenant(const std::string& id) override;
  Result<std::vector<Channel>> PolledChannels() override;
  Result<std::vector<ChannelLease>> ChannelLeases() override;
  Result<std::vector<ChannelReply>> DueReplies(Millis now, const std::string& origin,
                                               int limit) override;
  Result<std::vector<std::pair<std::string, std::string>>> ApprovalsToCard(int limit) override;
  // RunStore
  Result<int64_t> CountQueuedRuns() override;
  Result<std::vector<NodeInfo>> ListNodes(Millis within_ms) override;
  Result<bool> SessionBusy(const std::string& tenant_id, const std::string& session_id) override;
  Result<IntakeView> ForIntake(const std::string& tenant_id,
                               const std::string& session_id) override;
  Result<IntakeRead> ReadForIntake(const std::string& tenant_id,
                                   const std::string& session_id) override;
  Status StartIdleSession(const std::string& tenant_id, const std::string& session_id,
                          const std::string& agent_id, int64_t max_active, Millis at) override;
  Result<std::vector<Run>> ClaimableRuns(Millis now, int limit) override;
  Status ExpireLeasesOf(const std::string& owner) override;
  Status RenewLeases(const std::string& owner, const std::vector<std::string>& run_ids,
                     Millis expires_at) override;
  // EventLog
  Status Append(NewEvent e) override;
  // ExportStore
  Status ExportTable(const std::string& tenant_id, const std::string& table,
                     const std::function<Status(const Json& row)>& emit) override;
  Status ImportRow(const std::string& table, const Json& row) override;
  Status FinishImport() override;
  Result<bool> IsEmpty() override;

  // ApprovalStore
  Result<std::vector<Approval>> ExpiredApprovals(Millis now, int limit) override;

  // PluginStore
  Result<std::vector<PluginDelivery>> DueDeliveries(Millis now, int limit) override;

  // ScheduleStore
  Result<std::vector<Schedule>> DueSchedules(Millis now, int limit) override;
  Result<std::optional<Millis>> NextFireAt() override;
  // UsageStore
  Result<int64_t> PruneCache(Millis before, int64_t max_entries) override;
  // MemoryStore (postgres_memory.cc)
  Status UpsertMemory(const Memory& m) override;
  Result<std::vector<MemoryHit>> SearchMemories(const std::string& tenant_id,
                                                const std::string& agent_id,
                                                const MemorySearch& search) override;

  // CompactionStore
  Result<Conversation> ConversationSince(const std::string& tenant_id,
                                         const std::string& session_id,
                                         const std::string& after_id, int64_t after_seq,
                                         int limit) override;
  Result<Conversation> ConversationSinceLatest(const std::string& tenant_id,
                                               const std::string& session_id, int64_t after_seq,
                                               int limit) override;

  // IntrospectionStore
  Result<std::vector<IntrospectionDue>> DueIntrospections(Millis now, int limit) override;

 private:
  // An appended event not sent yet: its index in appended_, its stored payload and its hash.
  struct HeldEvent {
    size_t index;
    std::string payload;
    std::string hash;
  };
  // The answer of SendEvents' insert of `indexes` (in appended_) for a tenant and origin.
  void Arrived(const Rows& rows, const std::vector<size_t>& indexes, const std::string& tenant_id,
               const std::string& origin);
  std::vector<HeldEvent> held_events_;
  // The positions and origin_seqs of the transaction's inserted events, by id, as they arrive.
  std::unordered_map<std::string, std::pair<int64_t, int64_t>> arrived_;

  // Binds the transaction to `tenant_id` (row-level security) unless it already is.
  Status BindTenant(const std::string& tenant_id) { return sql_.BindTenant(tenant_id); }
  // For the (tenant_id, id) rows `keys` that a runtime-wide function returned: runs `sql`
  // ($1 a tenant, $2 its ids as text[]) once per tenant, bound to that tenant, so that the
  // records themselves are read under row-level security.
  Result<std::vector<std::pair<std::string, Rows>>> RowsOfKeys(const Rows& keys,
                                                               const std::string& sql);

  Result<std::optional<ChainHead>> LoadChainHead(const std::string& tenant_id,
                                                 const std::string& origin);

  Conn& conn_;
};

// The records of `found` (RowsOfKeys) in the order of `keys` ((tenant_id, id) rows); a key
// whose row is gone is skipped.
template <typename T, typename ReadFn>
std::vector<T> InKeyOrder(const Rows& keys, const std::vector<std::pair<std::string, Rows>>& found,
                          ReadFn read) {
  std::vector<T> records;
  for (const auto& [tenant, rows] : found) {
    for (int i = 0; i < rows.size(); ++i) records.push_back(read(Row(rows, i)));
  }
  std::vector<T> out;
  out.reserve(records.size());
  for (int k = 0; k < keys.size(); ++k) {
    auto it = std::find_if(records.begin(), records.end(), [&](const T& r) {
      return r.id == keys.Text(k, 1) && r.tenant_id == keys.Text(k, 0);
    });
    if (it != records.end()) out.push_back(std::move(*it));
  }
  return out;
}

// The schema, one entry per version: src/keel/store/postgres/migrations/NNNN_*.sql in order,
// embedded by the build (src/keel/store/migrations.cc.in). Each is applied in one transaction.
const std::vector<const char*>& Migrations();

}  // namespace keel::store::postgres
