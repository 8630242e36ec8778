#pragma once
// SqliteTx: every storage port on one SQLite connection, most of them written once for both
// backends in store/sql_tx.h. One SqliteTx is bound to one Db for its lifetime and reused across
// units of work on that connection; it is used by the thread that owns the connection only (the
// writer thread, or a reader holding it).

#include <string>
#include <vector>

#include "keel/store/sql_tx.h"
#include "keel/store/sqlite/sqlite_db.h"

namespace keel::store::sqlite {

class SqliteTx final : public SqlTx<SqliteSql> {
 public:
  // `audit_key`: signs the chain heads this Tx writes (store/audit.h); "" unsigned.
  SqliteTx(Db& db, std::string origin, std::string audit_key)
      : SqlTx(SqliteSql(db), std::move(origin), std::move(audit_key)), db_(db) {
    head_loader_ = [this](const std::string& tenant_id, const std::string& origin) {
      return LoadChainHead(tenant_id, origin);
    };
  }

  // Before COMMIT: writes the heads of the chains the transaction's units extended.
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
  // MemoryStore (sqlite_memory.cc)
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
  // Gives memories imported without their search scope (ImportRow leaves it empty) their scope.
  Status ScopeImportedMemories();

  Result<std::optional<ChainHead>> LoadChainHead(const std::string& tenant_id,
                                                 const std::string& origin);
  // The conversation `sql` reads (bound: the session, the tenant, after_seq, then `rest`), and
  // the session's newest seq.
  template <typename... Args>
  Result<Conversation> ReadConversation(const std::string& sql, const std::string& tenant_id,
                                        const std::string& session_id, int64_t after_seq,
                                        const Args&... rest);

  Db& db_;
};

// The schema, one entry per version: src/keel/store/sqlite/migrations/NNNN_*.sql in order, embedded
// by the build (src/keel/store/migrations.cc.in). Each is applied in one transaction.
const std::vector<const char*>& Migrations();

}  // namespace keel::store::sqlite
