#pragma once
// Internal to the store backends: SqlTx, the storage ports written once for both SQL backends.
// SqliteTx and PostgresTx derive from it and implement what their dialects do differently (the
// runtime-wide reads, the event log and its audit chain, export and import, full-text search).
//
// `Sql` is the backend's dialect adapter (sqlite::SqliteSql, postgres::PgSql), bound to the
// Tx's connection:
//   Row                          the row a reader of store/rows.h reads (Text, Int, OptInt)
//   Query(sql, args...)          Result<Row> to Step() through, the statement run with `args`
//   Exec(sql, args...)           Result<int64_t>, the rows an INSERT, UPDATE or DELETE changed
//   Send(sql, args...)           Status, a write whose result is not read (pipelined on
//                                PostgreSQL: its failure fails the unit when collected)
//   Later(sql, take, args...)    Status, a read whose rows `take(Row&)` gets later (Tx's
//                                ...Later reads, store.h): at once on SQLite, pipelined on
//                                PostgreSQL (its rows arrive with the next statement's answer)
//   Flush()                      Status, waits until every Later read has its rows
//   BindTenant(tenant_id)        the tenant the next statements read and write (row-level
//                                security on PostgreSQL, nothing on SQLite)
//   Limit(n)                     a LIMIT parameter, negative n meaning no limit
//   kLockSkipLocked              appended to a SELECT that locks its row for the transaction,
//                                passing over a row another transaction holds
//   kLockKeyShare                appended to a SELECT whose row must not be deleted until the
//                                transaction ends
//   kMemoryHasTag                whether a memories row's tags (a JSON array) hold the tag $5
// The SQL is written once, with PostgreSQL's $N parameters, which SQLite reads as ?N.
// Inserts say ON CONFLICT DO NOTHING and report a duplicate as kConflict with a message that
// names it, so that a duplicate leaves the transaction usable on both backends.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "keel/store/audit.h"
#include "keel/store/channel_store.h"
#include "keel/store/compaction_store.h"
#include "keel/store/introspection_store.h"
#include "keel/store/memory_store.h"
#include "keel/store/schedule_store.h"
#include "keel/store/skill_store.h"
#include "keel/store/store.h"
#include "keel/store/usage_store.h"
#include "keel/store/user_store.h"

namespace keel::store {

// Counters a store's only writer hands out in order (SqliteTx: a tenant's event positions and
// each origin's origin_seq), kept between transactions as the chain heads are (ChainSealer):
// each key's last number as committed, as the transaction's finished units moved it, and as
// the current unit did. A rolled back unit or transaction takes its numbers with it.
class KeptNumbers {
 public:
  // The number after `key`'s last; `load` reads the last from the store when none is kept.
  Result<int64_t> Next(const std::string& key, const std::function<Result<int64_t>()>& load) {
    for (const auto* level : {&unit_, &txn_, &kept_}) {
      auto it = level->find(key);
      if (it != level->end()) return it->second + 1;
    }
    KEEL_ASSIGN_OR_RETURN(int64_t last, load());
    return last + 1;
  }
  // `n` (from Next) was used: it is `key`'s last in this unit.
  void Used(const std::string& key, int64_t n) { unit_[key] = n; }
  void UnitFailed() { unit_.clear(); }
  void UnitDone() {
    for (auto& [key, n] : unit_) txn_[key] = n;
    unit_.clear();
  }
  void TransactionDone(bool committed) {
    if (committed) {
      for (auto& [key, n] : txn_) kept_[key] = n;
    }
    txn_.clear();
    unit_.clear();
  }
  // Forgets every number (after rows were written behind the counters: an import).
  void Forget() {
    kept_.clear();
    txn_.clear();
    unit_.clear();
  }

 private:
  std::unordered_map<std::string, int64_t> kept_, txn_, unit_;
};

template <typename Sql>
class SqlTx : public Tx,
              public TenantStore,
              public TokenStore,
              public SecretStore,
              public PolicyStore,
              public ApprovalStore,
              public McpServerStore,
              public PluginStore,
              public ScheduleStore,
              public UsageStore,
              public MemoryStore,
              public SkillStore,
              public ChannelStore,
              public UserStore,
              public CompactionStore,
              public IntrospectionStore,
              public AgentStore,
              public SessionStore,
              public MessageStore,
              public RunStore,
              public EventLog,
              public ExportStore {
 public:
  TenantStore& tenants() override { return *this; }
  TokenStore& tokens() override { return *this; }
  SecretStore& secrets() override { return *this; }
  PolicyStore& policies() override { return *this; }
  ApprovalStore& approvals() override { return *this; }
  McpServerStore& mcp_servers() override { return *this; }
  PluginStore& plugins() override { return *this; }
  ScheduleStore& schedules() override { return *this; }
  UsageStore& usage() override { return *this; }
  MemoryStore& memory() override { return *this; }
  SkillStore& skills() override { return *this; }
  ChannelStore& channels() override { return *this; }
  UserStore& users() override { return *this; }
  CompactionStore& compactions() override { return *this; }
  IntrospectionStore& introspection() override { return *this; }
  AgentStore& agents() override { return *this; }
  SessionStore& sessions() override { return *this; }
  MessageStore& messages() override { return *this; }
  RunStore& runs() override { return *this; }
  EventLog& events() override { return *this; }
  ExportStore& exports() override { return *this; }
  const std::vector<Event>& appended() const override { return appended_; }

  // Starts a new unit of work: forgets the events appended by the previous one (and, when it
  // failed, the chain heads it moved).
  void ResetUnit() {
    appended_.clear();
    sealer_.UnitFailed();
    numbers_.UnitFailed();
    unit_totals_.clear();
  }
  // The unit succeeded: its events, whose chain heads join the transaction's, as its additions
  // to the usage totals join the transaction's.
  std::vector<Event> TakeAppended() {
    sealer_.UnitDone(appended_);
    numbers_.UnitDone();
    for (auto& [row, add] : unit_totals_) AddTo(txn_totals_[row], add);
    unit_totals_.clear();
    return std::move(appended_);
  }
  // Before COMMIT: the transaction's additions to the usage totals, one statement per row.
  Status WriteTotals();
  // After the transaction committed or rolled back.
  void TransactionDone(bool committed) {
    sealer_.TransactionDone(committed);
    numbers_.TransactionDone(committed);
    unit_totals_.clear();
    txn_totals_.clear();
  }

  // TenantStore
  Status InsertTenant(const Tenant& t) override;
  Result<Tenant> GetTenant(const std::string& id) override;
  Status Flush() override { return sql_.Flush(); }
  Status UpdateTenantSettings(const Tenant& t) override;
  Status SettingsVersionLater(const std::string& tenant_id, int64_t& out) override;
  // TokenStore
  Status InsertToken(const Token& t) override;
  Result<std::vector<Token>> ListTokens(const std::string& tenant_id) override;
  Result<Token> GetToken(const std::string& tenant_id, const std::string& id) override;
  Status RevokeToken(const std::string& tenant_id, const std::string& id, Millis at) override;
  // SecretStore
  Result<std::optional<TenantKey>> GetTenantKey(const std::string& tenant_id) override;
  Status InsertTenantKey(const TenantKey& k) override;
  Status PutSecret(const Secret& s) override;
  Result<Secret> GetSecret(const std::string& tenant_id, const std::string& name) override;
  Result<std::vector<Secret>> ListSecrets(const std::string& tenant_id) override;
  Status DeleteSecret(const std::string& tenant_id, const std::string& name) override;
  // PolicyStore
  Result<std::optional<PolicyDoc>> GetPolicy(const std::string& tenant_id,
                                             const std::string& scope) override;
  Status PutPolicy(const PolicyDoc& p) override;
  Status DeletePolicy(const std::string& tenant_id, const std::string& scope) override;
  Result<std::vector<EmergencyStop>> ListStops(const std::string& tenant_id) override;
  Status ListStopsLater(const std::string& tenant_id, std::vector<EmergencyStop>& out) override;
  Status PutStop(const EmergencyStop& s) override;
  Status DeleteStop(const std::string& tenant_id, const std::string& agent_id) override;
  // ApprovalStore
  Status InsertApproval(const Approval& a) override;
  Status UpdateApproval(const Approval& a) override;
  Result<Approval> GetApproval(const std::string& tenant_id, const std::string& id) override;
  Result<Paged<Approval>> ListApprovals(const std::string& tenant_id, const std::string& status,
                                        const Page& page) override;
  Result<std::optional<Approval>> FindApprovalForCall(const std::string& tenant_id,
                                                      const std::string& run_id,
                                                      const std::string& call_id) override;
  Status InsertStanding(const StandingApproval& s) override;
  Result<std::vector<StandingApproval>> ActiveStanding(const std::string& tenant_id,
                                                       const std::string& agent_id,
                                                       const std::string& tool,
                                                       Millis now) override;
  Result<std::vector<StandingApproval>> ListStanding(const std::string& tenant_id) override;
  Status RevokeStanding(const std::string& tenant_id, const std::string& id, Millis at) override;
  // McpServerStore
  Status InsertMcpServer(const McpServer& s) override;
  Result<McpServer> GetMcpServer(const std::string& tenant_id, const std::string& id) override;
  Result<McpServer> GetMcpServerByName(const std::string& tenant_id,
                                       const std::string& name) override;
  Result<std::vector<McpServer>> ListMcpServers(const std::string& tenant_id) override;
  Status DeleteMcpServer(const std::string& tenant_id, const std::string& id) override;
  // PluginStore
  Status UpsertPlugin(const Plugin& p) override;
  Result<Plugin> GetPlugin(const std::string& tenant_id, const std::string& id) override;
  Result<std::vector<Plugin>> ListPlugins(const std::string& tenant_id) override;
  Status DeletePlugin(const std::string& tenant_id, const std::string& id) override;
  Status EnablePlugin(const PluginEnablement& e) override;
  Status DisablePlugin(const std::string& tenant_id, const std::string& plugin_id,
                       const std::string& agent_id) override;
  Result<std::vector<PluginEnablement>> ListEnablements(const std::string& tenant_id,
                                                        const std::string& plugin_id) override;
  Result<std::vector<Plugin>> PluginsForAgent(const std::string& tenant_id,
                                              const std::string& agent_id) override;
  Status PluginStampsForAgentLater(const std::string& tenant_id, const std::string& agent_id,
                                   std::vector<PluginStamp>& out) override;
  Status InsertDelivery(const PluginDelivery& d) override;
  Status UpdateDelivery(const PluginDelivery& d) override;
  Result<PluginDelivery> GetDelivery(const std::string& tenant_id, const std::string& id) override;
  Result<Paged<PluginDelivery>> ListDeliveries(const std::string& tenant_id,
                                               const std::string& plugin_id,
                                               const std::string& status,
                                               const Page& page) override;
  // AgentStore
  Status InsertAgent(const Agent& a) override;
  Status UpdateAgent(const Agent& a) override;
  Result<Agent> GetAgent(const std::string& tenant_id, const std::string& id) override;
  Result<Agent> GetAgentByName(const std::string& tenant_id, const std::string& name) override;
  Result<Paged<Agent>> ListAgents(const std::string& tenant_id, const Page& page) override;
  Status DeleteAgent(const std::string& tenant_id, const std::string& id) override;
  // SessionStore
  Status InsertSession(const Session& s) override;
  Status UpdateSessionStatus(const std::string& tenant_id, const std::string& id,
                             const std::string& status, Millis at) override;
  Result<Session> GetSession(const std::string& tenant_id, const std::string& id) override;
  Result<Paged<Session>> ListSessions(const std::string& tenant_id, const std::string& agent_id,
                                      const Page& page, const std::string& opened_by) override;
  // MessageStore
  Status InsertMessage(const Message& m) override;
  Result<Message> GetMessage(const std::string& tenant_id, const std::string& id) override;
  Result<std::optional<Message>> FindByIdempotencyKey(const std::string& tenant_id,
                                                      const std::string& session_id,
                                                      const std::string& key) override;
  Result<Paged<Message>> ListMessages(const std::string& tenant_id, const std::string& session_id,
                                      const Page& page) override;
  Result<std::vector<Message>> RecentMessages(const std::string& tenant_id,
                                              const std::string& session_id,
                                              const std::string& after_id,
                                              const std::string& before_id, int limit) override;
  // RunStore
  Status InsertRun(const Run& r) override;
  Status UpdateRun(const Run& r) override;
  Status EndHeldRun(const Run& r) override;
  Result<Run> GetRun(const std::string& tenant_id, const std::string& id) override;
  Result<Run> LockRun(const std::string& tenant_id, const std::string& id) override;
  Result<Paged<Run>> ListRuns(const std::string& tenant_id, const RunFilter& filter,
                              const Page& page) override;
  Result<int64_t> CountActiveRuns(const std::string& tenant_id) override;
  Status InsertStep(const Step& s) override;
  Status UpdateStep(const Step& s) override;
  Result<std::vector<Step>> ListSteps(const std::string& tenant_id,
                                      const std::string& run_id) override;
  Status InsertToolCall(const ToolCall& c) override;
  Status UpdateToolCall(const ToolCall& c) override;
  Result<std::vector<ToolCall>> ListToolCalls(const std::string& tenant_id,
                                              const std::string& run_id) override;

  // ScheduleStore
  Status InsertSchedule(const Schedule& s) override;
  Status UpdateSchedule(const Schedule& s) override;
  Result<Schedule> GetSchedule(const std::string& tenant_id, const std::string& id) override;
  Result<Paged<Schedule>> ListSchedules(const std::string& tenant_id, const std::string& agent_id,
                                        const Page& page) override;
  Status DeleteSchedule(const std::string& tenant_id, const std::string& id) override;
  Status InsertFire(const ScheduleFire& f) override;
  Result<std::vector<ScheduleFire>> RecentFires(const std::string& tenant_id,
                                                const std::string& schedule_id, int limit) override;
  Result<std::optional<ScheduleFire>> FireOfRun(const std::string& tenant_id,
                                                const std::string& run_id) override;
  // SkillStore
  Status UpsertSkill(const Skill& s) override;
  Result<Skill> GetSkill(const std::string& tenant_id, const std::string& name,
                         bool with_files) override;
  Result<std::vector<Skill>> ListSkills(const std::string& tenant_id) override;
  Status DeleteSkill(const std::string& tenant_id, const std::string& name) override;
  Status AssignSkill(const SkillAssignment& a) override;
  Status UnassignSkill(const std::string& tenant_id, const std::string& agent_id,
                       const std::string& name) override;
  Result<std::vector<SkillAssignment>> ListSkillAssignments(const std::string& tenant_id,
                                                            const std::string& name) override;
  Result<std::vector<Skill>> SkillsForAgent(const std::string& tenant_id,
                                            const std::string& agent_id, bool with_files) override;
  Status SkillsForAgentLater(const std::string& tenant_id, const std::string& agent_id,
                             bool with_files, std::vector<Skill>& out) override;
  // UserStore
  Status InsertUser(const User& u) override;
  Status UpdateUser(const User& u) override;
  Result<User> GetUser(const std::string& tenant_id, const std::string& id) override;
  Result<Paged<User>> ListUsers(const std::string& tenant_id, const Page& page) override;
  Result<std::vector<User>> MergedInto(const std::string& tenant_id,
                                       const std::string& user_id) override;
  Status InsertIdentity(const Identity& i) override;
  Status UpdateIdentity(const Identity& i) override;
  Status DeleteIdentity(const std::string& tenant_id, const std::string& platform,
                        const std::string& platform_user_id) override;
  Result<std::optional<Identity>> FindIdentity(const std::string& tenant_id,
                                               const std::string& platform,
                                               const std::string& platform_user_id) override;
  Result<std::vector<Identity>> UserIdentities(const std::string& tenant_id,
                                               const std::string& user_id) override;
  Status PutMember(const AgentMember& m) override;
  Status DeleteMember(const std::string& tenant_id, const std::string& agent_id,
                      const std::string& user_id) override;
  Result<std::optional<AgentMember>> GetMember(const std::string& tenant_id,
                                               const std::string& agent_id,
                                               const std::string& user_id) override;
  Result<Paged<AgentMember>> ListMembers(const std::string& tenant_id, const std::string& agent_id,
                                         const Page& page) override;
  Result<std::vector<AgentMember>> UserMemberships(const std::string& tenant_id,
                                                   const std::string& user_id) override;
  Result<std::optional<AgentAccess>> GetAccess(const std::string& tenant_id,
                                               const std::string& agent_id) override;
  Status PutAccess(const AgentAccess& a) override;

  // ChannelStore
  Status InsertChannel(const Channel& c) override;
  Status UpdateChannel(const Channel& c) override;
  Result<Channel> GetChannel(const std::string& tenant_id, const std::string& id) override;
  Result<Paged<Channel>> ListChannels(const std::string& tenant_id, const std::string& agent_id,
                                      const Page& page) override;
  Status DeleteChannel(const std::string& tenant_id, const std::string& id) override;
  Result<std::optional<ChannelConversation>> GetConversation(
      const std::string& tenant_id, const std::string& channel_id,
      const std::string& conversation) override;
  Status InsertConversation(const ChannelConversation& c) override;
  Result<bool> SetConversationContact(const std::string& tenant_id, const std::string& channel_id,
                                      const std::string& conversation,
                                      const std::string& contact) override;
  Result<std::optional<std::string>> DeliverySession(const std::string& tenant_id,
                                                     const std::string& channel_id,
                                                     const std::string& delivery_id) override;
  Status InsertDelivery(const ChannelDelivery& d) override;
  Result<std::optional<ChannelPoll>> GetPoll(const std::string& tenant_id,
                                             const std::string& channel_id) override;
  Status PutPoll(const ChannelPoll& p) override;
  Result<bool> LeaseChannel(const std::string& tenant_id, const std::string& channel_id,
                            const std::string& origin, Millis now, Millis until) override;
  Status InsertReply(const ChannelReply& r) override;
  Status UpdateReply(const ChannelReply& r) override;
  Result<Paged<ChannelReply>> ListReplies(const std::string& tenant_id,
                                          const std::string& channel_id, const std::string& status,
                                          const Page& page) override;
  Result<std::optional<std::string>> ContactConversation(const std::string& tenant_id,
                                                         const std::string& channel_id,
                                                         const std::string& contact) override;
  Result<std::vector<ChannelReply>> ApprovalCards(const std::string& tenant_id,
                                                  const std::string& approval_id) override;
  Result<std::optional<ChannelReply>> RunReply(const std::string& tenant_id,
                                               const std::string& run_id) override;
  Result<int64_t> UserTokensSince(const std::string& tenant_id, const std::string& agent_id,
                                  const std::string& user_id, Millis since) override;
  // CompactionStore
  Status InsertCompaction(const Compaction& c) override;
  Status LatestCompactionLater(const std::string& tenant_id, const std::string& session_id,
                               std::optional<Compaction>& out) override;
  Result<Paged<Compaction>> ListCompactions(const std::string& tenant_id,
                                            const std::string& session_id,
                                            const Page& page) override;
  // IntrospectionStore
  Status SetSessionDescription(const std::string& tenant_id, const std::string& session_id,
                               const std::string& description, Millis at) override;
  Result<int64_t> TurnsSinceIntrospection(const std::string& tenant_id,
                                          const std::string& session_id) override;
  Status PutIntrospectionDue(const IntrospectionDue& d) override;
  Status ClearIntrospectionDue(const std::string& tenant_id, const std::string& session_id,
                               Millis due_at) override;
  // EventLog (Append is the backend's: the numbering and the audit chain)
  Result<std::vector<Event>> ReadEvents(const std::string& tenant_id, int64_t after,
                                        const EventFilter& filter, int limit) override;
  Result<std::vector<Event>> ReadEventsBefore(const std::string& tenant_id, int64_t before,
                                              const EventFilter& filter, int limit) override;
  Result<int64_t> LastPosition(const std::string& tenant_id) override;
  Result<std::vector<Event>> RecentRunEvents(const std::string& tenant_id,
                                             const std::string& run_id, int window) override;
  // UsageStore
  Status InsertUsage(const UsageRecord& u) override;
  Result<UsageTotals> RunUsage(const std::string& tenant_id, const std::string& run_id) override;
  Result<UsageTotals> PeriodUsage(const std::string& tenant_id, const std::string& agent_id,
                                  const std::string& period, Millis start) override;
  Result<std::vector<AgentUsage>> PeriodUsageByAgent(const std::string& tenant_id,
                                                     const std::string& period,
                                                     Millis start) override;
  Result<std::vector<PeriodTotals>> UsageHistory(const std::string& tenant_id,
                                                 const std::string& period, Millis since) override;
  Status PutBudget(const Budget& b) override;
  Result<std::vector<Budget>> ListBudgets(const std::string& tenant_id) override;
  Status ListBudgetsLater(const std::string& tenant_id, std::vector<Budget>& out) override;
  Status DeleteBudget(const std::string& tenant_id, const std::string& scope,
                      const std::string& period) override;
  Result<std::optional<CacheEntry>> GetCacheEntry(const std::string& tenant_id,
                                                  const std::string& cache_group,
                                                  const std::string& key,
                                                  Millis not_before) override;
  Status PutCacheEntry(const CacheEntry& e) override;
  // MemoryStore
  Result<Memory> GetMemory(const std::string& tenant_id, const std::string& agent_id,
                           const std::string& id) override;
  Result<Memory> FindMemory(const std::string& tenant_id, const std::string& id) override;
  Status DeleteMemory(const std::string& tenant_id, const std::string& agent_id,
                      const std::string& id) override;
  Result<Paged<Memory>> ListMemories(const std::string& tenant_id, const std::string& agent_id,
                                     const std::string& tag, const Page& page) override;
  Result<WorkingMemory> GetWorkingMemory(const std::string& tenant_id,
                                         const std::string& agent_id) override;
  Status GetWorkingMemoryLater(const std::string& tenant_id, const std::string& agent_id,
                               WorkingMemory& out) override;
  Status PutWorkingMemory(const WorkingMemory& w) override;

 protected:
  // `audit_key`: signs the chain heads this Tx writes (store/audit.h); "" unsigned.
  SqlTx(Sql sql, std::string origin, std::string audit_key);
  ~SqlTx() override = default;

  // `n` as the event this Tx appends (its id, origin and time), added to appended_; the backend
  // numbers it, stores it, and takes it back out if that fails.
  Event& NewAppended(NewEvent n);

  Sql sql_;
  std::string origin_;
  std::vector<Event> appended_;
  // A usage totals row: a tenant's (agent "") or an agent's, of one day or month.
  struct TotalsRow {
    std::string tenant_id, agent_id, period;
    Millis period_start = 0;
    auto operator<=>(const TotalsRow&) const = default;
  };
  // Sums stop at 2^63 - 1 (WriteTotals says why).
  static void AddTo(UsageTotals& to, const UsageTotals& add) {
    auto sum = [](int64_t& a, int64_t b) {
      if (__builtin_add_overflow(a, b, &a)) a = INT64_MAX;
    };
    sum(to.calls, add.calls);
    sum(to.cached_calls, add.cached_calls);
    sum(to.input_tokens, add.input_tokens);
    sum(to.output_tokens, add.output_tokens);
    sum(to.cost_micros, add.cost_micros);
    sum(to.saved_micros, add.saved_micros);
  }
  // Every model call adds to the same four totals rows (its agent's and its tenant's, this
  // day's and this month's): the additions are summed, per unit and then per transaction, and
  // written once before COMMIT (WriteTotals) rather than four row updates per call.
  std::map<TotalsRow, UsageTotals> unit_totals_, txn_totals_;
  ChainSealer sealer_;
  ChainSealer::HeadLoader head_loader_;  // set by the backend, which loads the heads
  KeptNumbers numbers_;                  // used by a backend that numbers events itself
};

}  // namespace keel::store
