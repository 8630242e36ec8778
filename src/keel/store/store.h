#pragma once
// Storage ports. Each concern has its own interface (TenantStore, AgentStore, ..., EventLog);
// a transaction (Tx) hands out all of them so that one unit of work can change several
// concerns atomically — e.g. intake writes a message, a run and their events together.
//
// Reads run in a snapshot with their own connection and never block the writer: Store::Read on
// the calling thread; Store::ReadAsync (through AsyncRead in async.h, for coroutines) off it
// when a read waits on a network, so that an event loop never waits on the database. Writes are submitted to the store's single writer (Store::Write),
// which commits many submitted units of work per fsync (group commit); the callback runs on
// the writer thread after the commit is durable. Every write that changes state appends an
// event to the EventLog inside the same unit of work (DESIGN.md invariant 2).

#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "keel/common/status.h"
#include "keel/store/types.h"

namespace keel::store {

class ScheduleStore;  // schedule_store.h
class UsageStore;  // usage_store.h
class MemoryStore;  // memory_store.h
class SkillStore;       // skill_store.h
class ChannelStore;     // channel_store.h
class UserStore;        // user_store.h
class CompactionStore;     // compaction_store.h
class IntrospectionStore;  // introspection_store.h

class TenantStore {
 public:
  virtual ~TenantStore() = default;
  virtual Status InsertTenant(const Tenant& t) = 0;
  virtual Result<Tenant> GetTenant(const std::string& id) = 0;
  virtual Result<std::vector<Tenant>> ListTenants() = 0;
  // Writes the tenant's settings (allow_host_exec, allow_stdio_mcp). kNotFound when unknown.
  virtual Status UpdateTenantSettings(const Tenant& t) = 0;
  // The tenant's settings version (0 before any): it changes, in the unit that commits the
  // change, whenever an emergency stop, working memory, skill, skill assignment, plugin or plugin
  // assignment of the tenant is written or deleted (the schema's triggers keep it).
  // Set when the transaction's reads are flushed (Later).
  virtual Status SettingsVersionLater(const std::string& tenant_id, int64_t& out) = 0;
};

class TokenStore {
 public:
  virtual ~TokenStore() = default;
  virtual Status InsertToken(const Token& t) = 0;
  // Not scoped to a tenant: the token identifies the tenant. kNotFound for unknown or revoked.
  virtual Result<Token> FindActiveTokenByHash(const std::string& hash) = 0;
  virtual Result<std::vector<Token>> ListTokens(const std::string& tenant_id) = 0;
  // One token of the tenant, revoked or not; kNotFound when it is not the tenant's.
  virtual Result<Token> GetToken(const std::string& tenant_id, const std::string& id) = 0;
  // kNotFound when the token is not the tenant's or already revoked.
  virtual Status RevokeToken(const std::string& tenant_id, const std::string& id, Millis at) = 0;
};

class SecretStore {
 public:
  virtual ~SecretStore() = default;
  virtual Result<std::optional<TenantKey>> GetTenantKey(const std::string& tenant_id) = 0;
  // kConflict when the tenant has one.
  virtual Status InsertTenantKey(const TenantKey& k) = 0;
  // Inserts the secret or replaces its sealed value and updated_at (created_at stays).
  virtual Status PutSecret(const Secret& s) = 0;
  // kNotFound "secret not found: NAME".
  virtual Result<Secret> GetSecret(const std::string& tenant_id, const std::string& name) = 0;
  // By name.
  virtual Result<std::vector<Secret>> ListSecrets(const std::string& tenant_id) = 0;
  // kNotFound "secret not found: NAME".
  virtual Status DeleteSecret(const std::string& tenant_id, const std::string& name) = 0;
};

class PolicyStore {
 public:
  virtual ~PolicyStore() = default;
  // scope "": the tenant frame; otherwise an agent id (its narrowing).
  virtual Result<std::optional<PolicyDoc>> GetPolicy(const std::string& tenant_id,
                                                     const std::string& scope) = 0;
  // Inserts or replaces.
  virtual Status PutPolicy(const PolicyDoc& p) = 0;
  // kNotFound when none is set.
  virtual Status DeletePolicy(const std::string& tenant_id, const std::string& scope) = 0;
  // The tenant's emergency stops, tenant-wide first.
  virtual Result<std::vector<EmergencyStop>> ListStops(const std::string& tenant_id) = 0;
  virtual Status ListStopsLater(const std::string& tenant_id, std::vector<EmergencyStop>& out) = 0;
  // Inserts or replaces (agent_id "" is tenant-wide).
  virtual Status PutStop(const EmergencyStop& s) = 0;
  // kNotFound when there is none.
  virtual Status DeleteStop(const std::string& tenant_id, const std::string& agent_id) = 0;
};

class ApprovalStore {
 public:
  virtual ~ApprovalStore() = default;
  virtual Status InsertApproval(const Approval& a) = 0;
  // Writes status, amended_arguments, decided_by, decision_reason, decided_at.
  virtual Status UpdateApproval(const Approval& a) = 0;
  virtual Result<Approval> GetApproval(const std::string& tenant_id, const std::string& id) = 0;
  // By id; `status` empty for all.
  virtual Result<Paged<Approval>> ListApprovals(const std::string& tenant_id,
                                                const std::string& status, const Page& page) = 0;
  virtual Result<std::optional<Approval>> FindApprovalForCall(const std::string& tenant_id,
                                                              const std::string& run_id,
                                                              const std::string& call_id) = 0;
  // Runtime-wide: pending approvals whose expires_at is before `now`, oldest first.
  virtual Result<std::vector<Approval>> ExpiredApprovals(Millis now, int limit) = 0;
  virtual Status InsertStanding(const StandingApproval& s) = 0;
  // The agent's standing approvals for `tool` that are neither revoked nor expired at `now`.
  virtual Result<std::vector<StandingApproval>> ActiveStanding(const std::string& tenant_id,
                                                               const std::string& agent_id,
                                                               const std::string& tool,
                                                               Millis now) = 0;
  // Every standing approval of the tenant, by id.
  virtual Result<std::vector<StandingApproval>> ListStanding(const std::string& tenant_id) = 0;
  // kNotFound when unknown or already revoked.
  virtual Status RevokeStanding(const std::string& tenant_id, const std::string& id,
                                Millis at) = 0;
};

class McpServerStore {
 public:
  virtual ~McpServerStore() = default;
  // kConflict when the tenant has a server of that name.
  virtual Status InsertMcpServer(const McpServer& s) = 0;
  virtual Result<McpServer> GetMcpServer(const std::string& tenant_id, const std::string& id) = 0;
  virtual Result<McpServer> GetMcpServerByName(const std::string& tenant_id,
                                               const std::string& name) = 0;
  // By name.
  virtual Result<std::vector<McpServer>> ListMcpServers(const std::string& tenant_id) = 0;
  virtual Status DeleteMcpServer(const std::string& tenant_id, const std::string& id) = 0;
};

class PluginStore {
 public:
  virtual ~PluginStore() = default;
  // Inserts or replaces (same tenant and id) a plugin; created_at is kept on replace.
  virtual Status UpsertPlugin(const Plugin& plugin) = 0;
  // kNotFound "plugin not found: ID".
  virtual Result<Plugin> GetPlugin(const std::string& tenant_id, const std::string& id) = 0;
  // By id.
  virtual Result<std::vector<Plugin>> ListPlugins(const std::string& tenant_id) = 0;
  // Deletes the plugin, its enablements and its deliveries. kNotFound when absent.
  virtual Status DeletePlugin(const std::string& tenant_id, const std::string& id) = 0;
  // Idempotent (enabling again keeps the first created_at). REQUIRES: the plugin exists
  // (kNotFound "plugin not found: ID" otherwise).
  virtual Status EnablePlugin(const PluginEnablement& e) = 0;
  // kNotFound when that enablement does not exist.
  virtual Status DisablePlugin(const std::string& tenant_id, const std::string& plugin_id,
                               const std::string& agent_id) = 0;
  // The plugin's enablements, by agent_id ("*" first); empty for an unknown plugin.
  virtual Result<std::vector<PluginEnablement>> ListEnablements(const std::string& tenant_id,
                                                                const std::string& plugin_id) = 0;
  // The plugins enabled for the agent (by its id or "*"), each once, ordered by id.
  virtual Result<std::vector<Plugin>> PluginsForAgent(const std::string& tenant_id,
                                                      const std::string& agent_id) = 0;
  // The same plugins' stamps only, ordered by id: no manifest, source or config is read;
  // filled later (Tx).
  virtual Status PluginStampsForAgentLater(const std::string& tenant_id,
                                           const std::string& agent_id,
                                           std::vector<PluginStamp>& out) = 0;

  // kConflict when the id exists; the plugin must exist (an integrity kConflict otherwise).
  virtual Status InsertDelivery(const PluginDelivery& d) = 0;
  // By tenant and id: writes status, attempts, next_attempt_at, last_status, last_error and
  // delivered_at. kNotFound "plugin delivery not found: ID".
  virtual Status UpdateDelivery(const PluginDelivery& d) = 0;
  // kNotFound "plugin delivery not found: ID".
  virtual Result<PluginDelivery> GetDelivery(const std::string& tenant_id,
                                             const std::string& id) = 0;
  // A plugin's deliveries, newest first (created_at, then id, descending); `status` empty for
  // all. kInvalidArgument for a cursor that is not one this list returned.
  virtual Result<Paged<PluginDelivery>> ListDeliveries(const std::string& tenant_id,
                                                        const std::string& plugin_id,
                                                        const std::string& status,
                                                        const Page& page) = 0;
  // Runtime-wide: pending deliveries whose next_attempt_at is at or before `now`, the longest
  // due first (next_attempt_at, then id). At most `limit`.
  virtual Result<std::vector<PluginDelivery>> DueDeliveries(Millis now, int limit) = 0;
};

class AgentStore {
 public:
  virtual ~AgentStore() = default;
  // kConflict when the name is taken in the tenant.
  virtual Status InsertAgent(const Agent& a) = 0;
  virtual Status UpdateAgent(const Agent& a) = 0;
  virtual Result<Agent> GetAgent(const std::string& tenant_id, const std::string& id) = 0;
  virtual Result<Agent> GetAgentByName(const std::string& tenant_id, const std::string& name) = 0;
  virtual Result<Paged<Agent>> ListAgents(const std::string& tenant_id, const Page& page) = 0;
  virtual Status DeleteAgent(const std::string& tenant_id, const std::string& id) = 0;
};

class SessionStore {
 public:
  virtual ~SessionStore() = default;
  virtual Status InsertSession(const Session& s) = 0;
  virtual Status UpdateSessionStatus(const std::string& tenant_id, const std::string& id,
                                     const std::string& status, Millis at) = 0;
  virtual Result<Session> GetSession(const std::string& tenant_id, const std::string& id) = 0;
  // `opened_by`: only the sessions that token opened (a guest's view; "" = every session).
  virtual Result<Paged<Session>> ListSessions(const std::string& tenant_id,
                                              const std::string& agent_id, const Page& page,
                                              const std::string& opened_by) = 0;
};

class MessageStore {
 public:
  virtual ~MessageStore() = default;
  // kConflict when (session, idempotency_key) already exists.
  virtual Status InsertMessage(const Message& m) = 0;
  virtual Result<Message> GetMessage(const std::string& tenant_id, const std::string& id) = 0;
  virtual Result<std::optional<Message>> FindByIdempotencyKey(const std::string& tenant_id,
                                                             const std::string& session_id,
                                                             const std::string& key) = 0;
  // A session's messages in the order they were committed (their seq, which each read here
  // carries); the cursor is a seq.
  virtual Result<Paged<Message>> ListMessages(const std::string& tenant_id,
                                              const std::string& session_id, const Page& page) = 0;
  // The last `limit` messages of a session committed after the message `after_id` ("" from the
  // first) and before the message `before_id` (both exclusive), oldest first.
  virtual Result<std::vector<Message>> RecentMessages(const std::string& tenant_id,
                                                      const std::string& session_id,
                                                      const std::string& after_id,
                                                      const std::string& before_id, int limit) = 0;
};

class RunStore {
 public:
  virtual ~RunStore() = default;
  virtual Status InsertRun(const Run& r) = 0;
  // Writes every mutable field of the run (status, attempt, output, error, usage, lease, times).
  virtual Status UpdateRun(const Run& r) = 0;
  // The ending of a running run by the execution holding it, with no read first: its status,
  // output, error, tokens and finished_at from `r`, and its lease's expiry cleared, when the run
  // is running, leased to r.lease_owner at r.attempt; else kConflict (on PostgreSQL when the
  // pipelined update's count arrives: see PgSql::ExecChanging).
  virtual Status EndHeldRun(const Run& r) = 0;
  virtual Result<Run> GetRun(const std::string& tenant_id, const std::string& id) = 0;
  // GetRun for a claim: also locks the run's row until the unit's transaction ends, and answers
  // kConflict at once when another transaction holds it (being claimed elsewhere: skip it).
  // PostgreSQL: SELECT ... FOR UPDATE SKIP LOCKED. SQLite: its one writer holds every row.
  virtual Result<Run> LockRun(const std::string& tenant_id, const std::string& id) = 0;
  virtual Result<Paged<Run>> ListRuns(const std::string& tenant_id, const RunFilter& filter,
                                      const Page& page) = 0;
  // Runs of the tenant queued or running (the ones that cost capacity).
  virtual Result<int64_t> CountActiveRuns(const std::string& tenant_id) = 0;
  // Runtime-wide, for the fleet's view: the runs of every tenant waiting to be claimed, and the
  // nodes that reported within `within_ms` (Store::SetNodeReport) by origin, the leader marked
  // (none on a store of one node, which publishes no report).
  virtual Result<int64_t> CountQueuedRuns() = 0;
  virtual Result<std::vector<NodeInfo>> ListNodes(Millis within_ms) = 0;
  // Whether the session has a run that is not terminal.
  virtual Result<bool> SessionBusy(const std::string& tenant_id, const std::string& session_id) = 0;
  // What intake checks before it takes a message into an existing session, read in one
  // statement (one round trip on PostgreSQL, in the writer's unit): the session (kNotFound as
  // GetSession), SessionBusy and CountActiveRuns.
  struct IntakeView {
    Session session;
    bool busy = false;
    int64_t active_runs = 0;
  };
  virtual Result<IntakeView> ForIntake(const std::string& tenant_id,
                                       const std::string& session_id) = 0;
  // What intake reads before its unit, in one statement (one round trip on PostgreSQL): the
  // session (kNotFound as GetSession), whether it is busy (SessionBusy) and its agent
  // (GetAgent; nullopt when the agent is deleted).
  struct IntakeRead {
    Session session;
    bool busy = false;
    int64_t settings_version = 0;  // TenantStore::SettingsVersionLater's, in the same snapshot
    std::optional<Agent> agent;
  };
  virtual Result<IntakeRead> ReadForIntake(const std::string& tenant_id,
                                           const std::string& session_id) = 0;
  // Marks an idle session running (UpdateSessionStatus) for a run intake claims without having
  // read the session in its unit (it read it just before, outside the writer): the session
  // changes only while it is `agent_id`'s, not inactive, has no unfinished run, and its tenant
  // has fewer than `max_active` runs queued or running, which is what ForIntake would have
  // found. Otherwise the unit fails with kConflict (when the count arrives on PostgreSQL: see
  // PgSql::ExecChanging), and intake runs it again, reading first. No read, no round trip.
  virtual Status StartIdleSession(const std::string& tenant_id, const std::string& session_id,
                                  const std::string& agent_id, int64_t max_active, Millis at) = 0;

  // Runtime-wide (not tenant-scoped): runs ready to execute now (queued runs whose session has
  // no earlier unfinished run, running runs whose lease expired before `now`), tenants taking
  // turns: every tenant's oldest, then every tenant's second, ... At most `limit`.
  virtual Result<std::vector<Run>> ClaimableRuns(Millis now, int limit) = 0;
  // Runtime-wide: expires every lease held by `owner` (used at start for a dead process's runs).
  virtual Status ExpireLeasesOf(const std::string& owner) = 0;
  // Runtime-wide: extends the leases of the given runs still held by `owner`.
  virtual Status RenewLeases(const std::string& owner, const std::vector<std::string>& run_ids,
                             Millis expires_at) = 0;

  virtual Status InsertStep(const Step& s) = 0;
  // Writes status, input, output and finished_at.
  virtual Status UpdateStep(const Step& s) = 0;
  virtual Result<std::vector<Step>> ListSteps(const std::string& tenant_id,
                                              const std::string& run_id) = 0;

  virtual Status InsertToolCall(const ToolCall& c) = 0;
  // Writes status, arguments (an approver may amend them), result and updated_at.
  virtual Status UpdateToolCall(const ToolCall& c) = 0;
  virtual Result<std::vector<ToolCall>> ListToolCalls(const std::string& tenant_id,
                                                      const std::string& run_id) = 0;
};

// Event to append; position, origin and origin_seq are assigned by the log.
struct NewEvent {
  std::string tenant_id;
  std::string type;
  std::string agent_id;
  std::string session_id;
  std::string run_id;
  Json payload = Json::object();
};

struct EventFilter {
  std::string agent_id;  // empty = any
  std::string session_id;
  std::string run_id;
};

class EventLog {
 public:
  virtual ~EventLog() = default;
  // Appends with the tenant's next position and the next origin_seq of (tenant, this store's
  // origin): both count the tenant's events only, so neither shows another tenant's activity.
  // The stored event (with its position and origin_seq) is in Tx::appended() and reaches the
  // unit's WriteDone.
  virtual Status Append(NewEvent e) = 0;
  // Events of the tenant with position > after, in position order, at most limit.
  virtual Result<std::vector<Event>> ReadEvents(const std::string& tenant_id, int64_t after,
                                                const EventFilter& filter, int limit) = 0;
  // Events of the tenant with position < before, the newest first, at most limit.
  virtual Result<std::vector<Event>> ReadEventsBefore(const std::string& tenant_id, int64_t before,
                                                      const EventFilter& filter, int limit) = 0;
  // The tenant's highest committed position (0 when it has no event).
  virtual Result<int64_t> LastPosition(const std::string& tenant_id) = 0;
  // The run's events among the tenant's newest `window` events, newest first: what it costs
  // is bounded by `window`, however long the log.
  virtual Result<std::vector<Event>> RecentRunEvents(const std::string& tenant_id,
                                                     const std::string& run_id, int window) = 0;
};

// A column of an exported table: how its value reads in an archive row.
enum class ColumnType {
  kText,    // JSON string (JSON-text columns too, verbatim, so archives match across backends)
  kInt,     // JSON integer
  kOptInt,  // JSON integer or null
};

struct ExportColumn {
  const char* name;
  ColumnType type;
};

// One table of `keel export` / `keel import`: its columns and the key its rows are ordered by.
struct ExportTableSpec {
  const char* name;
  std::vector<ExportColumn> columns;
  const char* order_by;  // "id", or "position" for events
};

// The exported tables, parents before children (the order rows are imported in).
const std::vector<ExportTableSpec>& ExportTables();
// nullptr when `table` is not one of them.
const ExportTableSpec* FindExportTable(const std::string& table);
// The tables that hold the runtime's own state and are not exported (the response cache,
// webhook deliveries, introspections due): a store with rows there is not empty either.
const std::vector<const char*>& RuntimeTables();
// kInvalidArgument unless `row` is an object with exactly the table's columns, each of its type.
Status CheckExportRow(const ExportTableSpec& table, const Json& row);

// Whole-table access for `keel export` / `keel import` (store/archive.h). Rows are JSON objects
// named like the columns (see ExportTableSpec). Not for the runtime: it bypasses the domain ports.
class ExportStore {
 public:
  virtual ~ExportStore() = default;
  // Emits every row of `table` in key order; only `tenant_id`'s rows unless it is empty (for
  // the tenants table, the tenant itself). Stops at the first error `emit` returns.
  virtual Status ExportTable(const std::string& tenant_id, const std::string& table,
                             const std::function<Status(const Json& row)>& emit) = 0;
  // Inserts one row as it is, keeping events' positions (the store-wide key and the tenant's)
  // and origin_seqs.
  // REQUIRES: CheckExportRow(table, row) is ok.
  virtual Status ImportRow(const std::string& table, const Json& row) = 0;
  // After the last ImportRow of a unit: moves the backend's counters (the store-wide event
  // key) past the imported rows.
  virtual Status FinishImport() = 0;
  // Whether no table has a row: no exported table, and none of RuntimeTables.
  virtual Result<bool> IsEmpty() = 0;
};

// One unit of work. A Tx is only valid inside the callback that received it.
//
// Reads named ...Later fill `out` by the end of the callback, or earlier: on SQLite at once,
// on PostgreSQL when the next statement that waits for an answer returns (they go out with it,
// in one round trip). So a read issues its independent ...Later reads first and looks at their
// results after the callback. A failure among them fails the read.
class Tx {
 public:
  virtual ~Tx() = default;
  // Waits until every read queued so far (the *Later reads) has its rows.
  virtual Status Flush() = 0;
  virtual TenantStore& tenants() = 0;
  virtual TokenStore& tokens() = 0;
  virtual SecretStore& secrets() = 0;
  virtual PolicyStore& policies() = 0;
  virtual ApprovalStore& approvals() = 0;
  virtual McpServerStore& mcp_servers() = 0;
  virtual PluginStore& plugins() = 0;
  virtual ScheduleStore& schedules() = 0;
  virtual UsageStore& usage() = 0;
  virtual MemoryStore& memory() = 0;
  virtual SkillStore& skills() = 0;
  virtual ChannelStore& channels() = 0;
  virtual UserStore& users() = 0;
  virtual CompactionStore& compactions() = 0;
  virtual IntrospectionStore& introspection() = 0;
  virtual AgentStore& agents() = 0;
  virtual SessionStore& sessions() = 0;
  virtual MessageStore& messages() = 0;
  virtual RunStore& runs() = 0;
  virtual EventLog& events() = 0;
  virtual ExportStore& exports() = 0;
  // Events appended so far in this unit of work (published to live streams after commit).
  virtual const std::vector<Event>& appended() const = 0;

  // A row image (store/row_images.h) for the next event this unit appends: EventLog::Append
  // adds what is carried to its payload's "rows". For a write whose event comes later in the
  // unit, or in a helper that appends none itself. A unit that ends with images carried and no
  // event after them fails (CarriedAll), so no write's state is left out of the log.
  // REQUIRES: `table` is a string literal.
  void Carry(const char* table, std::string image);
  // For the backends' EventLog::Append: adds the carried images to `payload`, the event's
  // payload as stored (an object's JSON text).
  Status AppendCarried(std::string& payload);
  // For the backends' writers, after a unit's callback succeeded: kInternal when images are
  // still carried. Clears them either way.
  Status CarriedAll();
  // For the backends' writers, before each unit.
  void ClearCarried() { carried_.clear(); }

 private:
  std::vector<std::pair<const char*, std::string>> carried_;  // (table, image) in write order
};

using WriteFn = std::function<Status(Tx&)>;
// Called on the writer thread after commit (or failure). `events` are those the unit appended.
using WriteDone = std::function<void(Status, std::vector<Event> events)>;
// How a unit is queued: Store::Write, WriteUrgent or WriteDeferred.
enum class WriteKind { kNormal, kUrgent, kDeferred };

struct StoreStats {
  int64_t commits = 0;       // fsynced transactions
  int64_t units = 0;         // units of work committed
  int64_t failed_units = 0;  // units rolled back
};

class Store {
 public:
  virtual ~Store() = default;
  // Runs `fn` in a read-only snapshot on the calling thread.
  virtual Status Read(const std::function<Status(Tx&)>& fn) = 0;
  // Runs `fn` as Read does and then `done` with its status. A store whose reads wait on a
  // network (PostgreSQL) runs both on one of its reader threads; a local one (SQLite, whose
  // reads take microseconds) runs them at once on the calling thread.
  virtual void ReadAsync(std::function<Status(Tx&)> fn, std::function<void(Status)> done) {
    done(Read(fn));
  }
  // Queues `fn` for the writer; `done` runs once it is durable or failed. When `fn` returns a
  // non-ok status, its changes are rolled back and the others in the same batch still commit.
  virtual void Write(WriteFn fn, WriteDone done) = 0;
  // Write for a unit whose latency is the point (a schedule's firing): it goes ahead of the
  // queued units that are not urgent, behind the urgent ones, and commits as any other. Its
  // callers bound how many they queue, so that other units are delayed, never starved.
  virtual void WriteUrgent(WriteFn fn, WriteDone done) { Write(std::move(fn), std::move(done)); }
  // Write for a unit whose caller tells no one of it until a later unit of its own is durable
  // (a turn whose request is answered when its run ends): `done` may run once the unit is
  // applied, before its transaction commits, which the writer may then hold open a moment
  // (a couple of milliseconds) for the units that follow, so that such a turn commits once. Its
  // events reach the listener when the transaction commits (`done` gets them only when it runs
  // after the commit). Should that commit fail, the unit is lost after `done` said ok, and the
  // caller's next unit finds none of it. The caller must not acknowledge the unit to anyone
  // before one of its later units (or store::AsyncFlush) is done.
  virtual void WriteDeferred(WriteFn fn, WriteDone done) { Write(std::move(fn), std::move(done)); }
  // Convenience for start-up and tools: Write and wait.
  Status WriteSync(WriteFn fn, std::vector<Event>* events = nullptr);
  // `listener` sees every committed unit's events, unit by unit in commit order, on the writer
  // thread, before the units' `done` callbacks run. Set once, before the first Write.
  virtual void SetCommitListener(std::function<void(const std::vector<Event>&)> listener) = 0;
  // Shared stores (PostgreSQL): `listener` is called, from a store thread, after another node
  // committed events, and after (re)connecting to the notification channel (something may
  // have changed meanwhile). It carries no events: the log is the truth, so re-read it. Calls
  // may be spurious or coalesced. Set once. SQLite calls it when a commit failed after
  // deferred units of it were told (WriteDeferred): their waiters re-read and find them gone.
  virtual void SetRemoteCommitListener(std::function<void()> listener) { (void)listener; }
  virtual std::string origin() const = 0;
  // Whether this node holds the cluster's leadership: one node at a time, for cluster-wide
  // duties (firing schedules). A store of one node always leads. Leadership can end at any
  // moment (a lost connection), so a duty must still be safe if two nodes briefly both act.
  virtual bool leader() const { return true; }
  // A draining node: stops seeking the leadership and gives it up at once if it leads, so that
  // another node takes the cluster-wide duties over without waiting for a lease to run out.
  // Final. A store of one node ignores it.
  virtual void Resign() {}
  virtual StoreStats stats() const = 0;
  // Stops the writer after draining queued work.
  virtual void Close() = 0;

  // What this node tells the fleet about itself (origin, seen_at and leader are filled in). A
  // shared store (PostgreSQL) publishes it once a second with the leadership lease, and
  // RunStore::ListNodes reads every node's; a store of one node publishes nothing.
  void SetNodeReport(std::function<NodeInfo()> report);
  // This node's report now (empty fields when none is set). Any thread.
  NodeInfo NodeReport() const;

 private:
  mutable std::mutex report_mu_;
  std::function<NodeInfo()> report_;
};

struct StoreOptions {
  std::string origin;     // this node's origin id for the event log
  bool sync_full = true;  // false: synchronous=NORMAL (not durable on power loss; says so)
  int max_batch = 512;    // units per commit
};

// Opens a store from its URL: "sqlite:///path/keel.db" (or a plain path), or
// "postgres://user[:password]@host:port/db" (also "postgresql://"). Applies migrations.
Result<std::unique_ptr<Store>> OpenStore(const std::string& url, const StoreOptions& options);

// Encodes/decodes the opaque list cursor.
std::string EncodeCursor(const std::string& last_key);
std::string DecodeCursor(const std::string& cursor);
// The key a page starts after (before, newest first): the cursor's, or from the start ("" in
// ascending order, "~" descending: above every id, whose characters are hex digits and '-').
std::string CursorFor(const Page& page);

}  // namespace keel::store
