#include "keel/store/store.h"

#include <future>

#include "keel/common/crypto.h"
#include "keel/common/time.h"
#include "keel/store/audit.h"
#include "keel/store/migrate.h"
#include "keel/store/postgres/postgres_store.h"
#include "keel/store/postgres/postgres_tx.h"
#include "keel/store/sqlite/sqlite_store.h"
#include "keel/store/sqlite/sqlite_tx.h"

namespace keel::store {

Status Store::WriteSync(WriteFn fn, std::vector<Event>* events) {
  std::promise<std::pair<Status, std::vector<Event>>> done;
  auto fut = done.get_future();
  Write(std::move(fn), [&done](Status s, std::vector<Event> ev) {
    done.set_value({std::move(s), std::move(ev)});
  });
  auto [status, ev] = fut.get();
  if (events) *events = std::move(ev);
  return status;
}

void Store::SetNodeReport(std::function<NodeInfo()> report) {
  std::lock_guard<std::mutex> lock(report_mu_);
  report_ = std::move(report);
}

NodeInfo Store::NodeReport() const {
  std::function<NodeInfo()> report;
  {
    std::lock_guard<std::mutex> lock(report_mu_);
    report = report_;
  }
  NodeInfo self = report ? report() : NodeInfo{};
  self.origin = origin();
  self.seen_at = NowMillis();
  self.leader = leader();
  return self;
}

const std::vector<ExportTableSpec>& ExportTables() {
  using T = ColumnType;
  static const std::vector<ExportTableSpec> kTables = {
      {"tenants",
       {{"id", T::kText},
        {"name", T::kText},
        {"created_at", T::kInt},
        {"allow_host_exec", T::kInt},
        {"allow_stdio_mcp", T::kInt}},
       "id"},
      {"api_tokens",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"name", T::kText},
        {"role", T::kText},
        {"hash", T::kText},
        {"created_at", T::kInt},
        {"revoked_at", T::kOptInt},
        {"parent_id", T::kText},
        {"expires_at", T::kOptInt},
        {"user_id", T::kText}},
       "id"},
      {"tenant_keys",
       {{"tenant_id", T::kText},
        {"wrapped", T::kText},
        {"kek_fingerprint", T::kText},
        {"created_at", T::kInt}},
       "tenant_id"},
      {"secrets",
       {{"tenant_id", T::kText},
        {"name", T::kText},
        {"sealed", T::kText},
        {"created_at", T::kInt},
        {"updated_at", T::kInt}},
       "tenant_id, name"},
      {"agents",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"name", T::kText},
        {"model", T::kText},
        {"instructions", T::kText},
        {"tools", T::kText},
        {"config", T::kText},
        {"status", T::kText},
        {"created_at", T::kInt},
        {"updated_at", T::kInt}},
       "id"},
      {"sessions",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"agent_id", T::kText},
        {"status", T::kText},
        {"title", T::kText},
        {"created_at", T::kInt},
        {"updated_at", T::kInt},
        {"description", T::kText},
        {"created_by", T::kText},
        {"instructions", T::kText}},
       "id"},
      {"messages",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"session_id", T::kText},
        {"run_id", T::kText},
        {"role", T::kText},
        {"content", T::kText},
        {"idempotency_key", T::kText},
        {"created_at", T::kInt},
        {"seq", T::kInt}},
       "id"},
      {"runs",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"session_id", T::kText},
        {"agent_id", T::kText},
        {"message_id", T::kText},
        {"status", T::kText},
        {"attempt", T::kInt},
        {"output", T::kText},
        {"error", T::kText},
        {"input_tokens", T::kInt},
        {"output_tokens", T::kInt},
        {"lease_owner", T::kText},
        {"lease_expires_at", T::kInt},
        {"cancel_requested", T::kInt},
        {"created_at", T::kInt},
        {"started_at", T::kOptInt},
        {"finished_at", T::kOptInt},
        {"requested_by", T::kText},
        {"caller_role", T::kText},
        {"user_id", T::kText},
        {"channel_id", T::kText}},
       "id"},
      {"run_steps",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"run_id", T::kText},
        {"seq", T::kInt},
        {"kind", T::kText},
        {"status", T::kText},
        {"input", T::kText},
        {"output", T::kText},
        {"started_at", T::kInt},
        {"finished_at", T::kOptInt}},
       "id"},
      {"tool_calls",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"run_id", T::kText},
        {"step_id", T::kText},
        {"call_id", T::kText},
        {"tool", T::kText},
        {"arguments", T::kText},
        {"effect_class", T::kText},
        {"effect_key", T::kText},
        {"status", T::kText},
        {"result", T::kText},
        {"created_at", T::kInt},
        {"updated_at", T::kInt}},
       "id"},
      {"policies",
       {{"tenant_id", T::kText}, {"scope", T::kText}, {"body", T::kText}, {"updated_at", T::kInt}},
       "tenant_id, scope"},
      {"emergency_stops",
       {{"tenant_id", T::kText},
        {"agent_id", T::kText},
        {"reason", T::kText},
        {"created_by", T::kText},
        {"created_at", T::kInt}},
       "tenant_id, agent_id"},
      {"approvals",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"run_id", T::kText},
        {"session_id", T::kText},
        {"agent_id", T::kText},
        {"call_id", T::kText},
        {"tool", T::kText},
        {"arguments", T::kText},
        {"amended_arguments", T::kText},
        {"reason", T::kText},
        {"status", T::kText},
        {"requested_by", T::kText},
        {"decided_by", T::kText},
        {"decision_reason", T::kText},
        {"created_at", T::kInt},
        {"expires_at", T::kInt},
        {"decided_at", T::kOptInt}},
       "id"},
      {"standing_approvals",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"agent_id", T::kText},
        {"tool", T::kText},
        {"arguments_match", T::kText},
        {"created_by", T::kText},
        {"approval_id", T::kText},
        {"created_at", T::kInt},
        {"expires_at", T::kInt},
        {"revoked_at", T::kOptInt}},
       "id"},
      {"mcp_servers",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"name", T::kText},
        {"transport", T::kText},
        {"config", T::kText},
        {"created_at", T::kInt}},
       "id"},
      {"plugins",
       {{"tenant_id", T::kText},
        {"id", T::kText},
        {"name", T::kText},
        {"version", T::kText},
        {"kind", T::kText},
        {"manifest", T::kText},
        {"source", T::kText},
        {"config", T::kText},
        {"created_at", T::kInt},
        {"updated_at", T::kInt}},
       "tenant_id, id"},
      {"agent_plugins",
       {{"tenant_id", T::kText},
        {"plugin_id", T::kText},
        {"agent_id", T::kText},
        {"created_at", T::kInt}},
       "tenant_id, plugin_id, agent_id"},
      // plugin_deliveries is not exported: it is the webhook plugins' outbound queue and its
      // history, not the tenant's configuration. An imported copy would deliver its pending
      // events a second time from the new store, to receivers outside Keel that may already
      // have them (or that a copy, such as a staging store, must not reach at all).
      {"schedules",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"agent_id", T::kText},
        {"name", T::kText},
        {"kind", T::kText},
        {"cron", T::kText},
        {"at", T::kOptInt},
        {"timezone", T::kText},
        {"prompt", T::kText},
        {"session_id", T::kText},
        {"missed", T::kText},
        {"status", T::kText},
        {"next_fire_at", T::kOptInt},
        {"last_fired_at", T::kOptInt},
        {"created_by", T::kText},
        {"caller_role", T::kText},
        {"created_at", T::kInt},
        {"updated_at", T::kInt},
        {"user_id", T::kText},
        {"channel_id", T::kText}},
       "id"},
      {"schedule_fires",
       {{"tenant_id", T::kText},
        {"schedule_id", T::kText},
        {"slot", T::kInt},
        {"fired_at", T::kInt},
        {"outcome", T::kText},
        {"session_id", T::kText},
        {"run_id", T::kText},
        {"message_id", T::kText},
        {"error", T::kText}},
       "schedule_id, slot"},
      {"memories",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"agent_id", T::kText},
        {"text", T::kText},
        {"tags", T::kText},
        {"source", T::kText},
        {"created_at", T::kInt},
        {"updated_at", T::kInt}},
       "tenant_id, agent_id, updated_at, id"},
      {"working_memories",
       {{"tenant_id", T::kText},
        {"agent_id", T::kText},
        {"text", T::kText},
        {"updated_at", T::kInt}},
       "tenant_id, agent_id"},
      {"skills",
       {{"tenant_id", T::kText},
        {"name", T::kText},
        {"description", T::kText},
        {"hash", T::kText},
        {"bytes", T::kInt},
        {"manifest", T::kText},
        {"created_at", T::kInt},
        {"updated_at", T::kInt},
        {"files", T::kText}},
       "tenant_id, name"},
      {"agent_skills",
       {{"tenant_id", T::kText},
        {"agent_id", T::kText},
        {"skill", T::kText},
        {"created_at", T::kInt}},
       "tenant_id, agent_id, skill"},
      {"channels",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"agent_id", T::kText},
        {"kind", T::kText},
        {"name", T::kText},
        {"settings", T::kText},
        {"enabled", T::kInt},
        {"created_by", T::kText},
        {"created_at", T::kInt},
        {"updated_at", T::kInt}},
       "id"},
      {"channel_conversations",
       {{"tenant_id", T::kText},
        {"channel_id", T::kText},
        {"conversation", T::kText},
        {"session_id", T::kText},
        {"created_at", T::kInt},
        {"contact", T::kText}},
       "channel_id, conversation"},
      {"channel_deliveries",
       {{"tenant_id", T::kText},
        {"channel_id", T::kText},
        {"delivery_id", T::kText},
        {"session_id", T::kText},
        {"created_at", T::kInt}},
       "channel_id, delivery_id"},
      {"users",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"name", T::kText},
        {"merged_into", T::kText},
        {"created_at", T::kInt},
        {"updated_at", T::kInt}},
       "id"},
      {"identities",
       {{"tenant_id", T::kText},
        {"platform", T::kText},
        {"platform_user_id", T::kText},
        {"user_id", T::kText},
        {"name", T::kText},
        {"created_at", T::kInt}},
       "tenant_id, platform, platform_user_id"},
      {"agent_members",
       {{"tenant_id", T::kText},
        {"agent_id", T::kText},
        {"user_id", T::kText},
        {"role", T::kText},
        {"created_at", T::kInt},
        {"updated_at", T::kInt}},
       "tenant_id, agent_id, user_id"},
      {"agent_access",
       {{"tenant_id", T::kText},
        {"agent_id", T::kText},
        {"level", T::kText},
        {"code_set", T::kInt},
        {"updated_at", T::kInt},
        {"guest_daily_tokens", T::kInt}},
       "tenant_id, agent_id"},
      {"compactions",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"session_id", T::kText},
        {"run_id", T::kText},
        {"last_message_id", T::kText},
        {"summary", T::kText},
        {"messages", T::kInt},
        {"tokens_before", T::kInt},
        {"tokens_after", T::kInt},
        {"created_at", T::kInt}},
       "id"},
      {"budgets",
       {{"tenant_id", T::kText},
        {"scope", T::kText},
        {"period", T::kText},
        {"limit_micros", T::kInt},
        {"created_at", T::kInt},
        {"updated_at", T::kInt}},
       "tenant_id, scope, period"},
      {"model_usage",
       {{"id", T::kText},
        {"tenant_id", T::kText},
        {"agent_id", T::kText},
        {"run_id", T::kText},
        {"step_id", T::kText},
        {"model", T::kText},
        {"input_tokens", T::kInt},
        {"output_tokens", T::kInt},
        {"cost_micros", T::kInt},
        {"saved_micros", T::kInt},
        {"cached", T::kInt},
        {"fallback", T::kInt},
        {"created_at", T::kInt}},
       "id"},
      {"usage_totals",
       {{"tenant_id", T::kText},
        {"agent_id", T::kText},
        {"period", T::kText},
        {"period_start", T::kInt},
        {"calls", T::kInt},
        {"cached_calls", T::kInt},
        {"input_tokens", T::kInt},
        {"output_tokens", T::kInt},
        {"cost_micros", T::kInt},
        {"saved_micros", T::kInt}},
       "tenant_id, period, period_start, agent_id"},
      // model_cache is not exported: it is a cache of model answers, which refills on its own,
      // and an archive should not carry (possibly large) copies of them.
      // introspection_due is not exported: it is the runtime's pending triggers, not the
      // tenant's data, and a copy would run introspections the source store already ran.
      // The audit chains' signed heads (store/audit.h), one per tenant and origin; before the
      // events, which stay the last table.
      {"audit_heads",
       {{"tenant_id", T::kText},
        {"origin", T::kText},
        {"last_id", T::kText},
        {"last_seq", T::kInt},
        {"hash", T::kText},
        {"anchor", T::kText},
        {"mac", T::kText}},
       "tenant_id, origin"},
      {"events",
       {{"position", T::kInt},
        {"id", T::kText},
        {"tenant_id", T::kText},
        {"tenant_position", T::kInt},
        {"type", T::kText},
        {"origin", T::kText},
        {"origin_seq", T::kInt},
        {"agent_id", T::kText},
        {"session_id", T::kText},
        {"run_id", T::kText},
        {"payload", T::kText},
        {"occurred_at", T::kInt},
        {"hash", T::kText}},
       "position"},
  };
  return kTables;
}

const std::vector<const char*>& RuntimeTables() {
  static const std::vector<const char*> kTables = {
      "model_cache", "plugin_deliveries", "introspection_due", "channel_polls", "channel_replies"};
  return kTables;
}

const ExportTableSpec* FindExportTable(const std::string& table) {
  for (const auto& t : ExportTables()) {
    if (table == t.name) return &t;
  }
  return nullptr;
}

Status CheckExportRow(const ExportTableSpec& table, const Json& row) {
  if (!row.is_object()) return InvalidArgument(std::string(table.name) + ": row is not an object");
  if (row.size() != table.columns.size()) {
    return InvalidArgument(std::string(table.name) + ": row has " + std::to_string(row.size()) +
                           " fields, expected " + std::to_string(table.columns.size()));
  }
  for (const auto& c : table.columns) {
    auto it = row.find(c.name);
    if (it == row.end()) {
      return InvalidArgument(std::string(table.name) + ": row lacks " + c.name);
    }
    bool ok = false;
    switch (c.type) {
      case ColumnType::kText:
        ok = it->is_string();
        break;
      case ColumnType::kInt:
        ok = it->is_number_integer();
        break;
      case ColumnType::kOptInt:
        ok = it->is_null() || it->is_number_integer();
        break;
    }
    // Integers are 64-bit signed in both backends.
    if (ok && it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      ok = false;
    }
    if (!ok) return InvalidArgument(std::string(table.name) + "." + c.name + ": wrong type");
  }
  return Status::Ok();
}

Result<std::unique_ptr<Store>> OpenStore(const std::string& url, const StoreOptions& options) {
  return OpenStore(url, options, "");
}

Result<std::unique_ptr<Store>> OpenStore(const std::string& url, const StoreOptions& options,
                                         const std::string& audit_key) {
  std::string path;
  if (url.rfind("sqlite://", 0) == 0) {
    path = url.substr(9);
  } else if (url.rfind("postgres://", 0) == 0 || url.rfind("postgresql://", 0) == 0) {
    return postgres::PostgresStore::Open(url, options, audit_key);
  } else if (url.find("://") != std::string::npos) {
    return InvalidArgument("unknown store URL scheme: " + url +
                           " (expected sqlite:///path/keel.db or postgres://user@host:port/db)");
  } else {
    path = url;
  }
  if (path.empty()) return InvalidArgument("store URL has no path: " + url);
  return sqlite::SqliteStore::Open(path, options, audit_key);
}

Status MigrateStore(const std::string& url, const std::string& owner_url) {
  if (url.rfind("postgres://", 0) != 0 && url.rfind("postgresql://", 0) != 0) {
    return InvalidArgument("store_owner applies to a PostgreSQL store only");
  }
  if (owner_url.rfind("postgres://", 0) != 0 && owner_url.rfind("postgresql://", 0) != 0) {
    return InvalidArgument("store_owner must be a postgres:// URL");
  }
  return postgres::PostgresStore::MigrateStore(url, owner_url);
}

namespace {
bool IsPostgresUrl(const std::string& url) {
  return url.rfind("postgres://", 0) == 0 || url.rfind("postgresql://", 0) == 0;
}
}  // namespace

Result<int64_t> StoreSchemaVersion(const std::string& url) {
  if (IsPostgresUrl(url)) return postgres::PostgresStore::SchemaVersion(url);
  if (url.rfind("sqlite://", 0) == 0) return sqlite::SqliteStore::SchemaVersion(url.substr(9));
  if (url.find("://") != std::string::npos)
    return InvalidArgument("unknown store URL scheme: " + url);
  return sqlite::SqliteStore::SchemaVersion(url);
}

int64_t SchemaVersionOf(const std::string& url) {
  return static_cast<int64_t>(IsPostgresUrl(url) ? postgres::Migrations().size()
                                                 : sqlite::Migrations().size());
}

std::string EncodeCursor(const std::string& last_key) {
  return last_key.empty() ? "" : Base64UrlEncode(last_key);
}
std::string DecodeCursor(const std::string& cursor) { return Base64UrlDecode(cursor); }

std::string CursorFor(const Page& page) {
  if (page.cursor.empty()) return page.newest_first ? "~" : "";
  return DecodeCursor(page.cursor);
}

}  // namespace keel::store
