#pragma once
// Internal to the store backends: the column lists of each record and how a result row maps to
// it. Both backends select the same columns in the same order, so one reader per record serves
// both; `Row` is the backend's row view with Text(i), Int(i) and OptInt(i). Also the cursor of
// ListDeliveries, the one list not ordered by id.

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "keel/common/status.h"
#include "keel/store/channel_store.h"
#include "keel/store/memory_store.h"
#include "keel/store/store.h"
#include "keel/store/types.h"
#include "keel/store/user_store.h"

namespace keel::store::rows {

// A JSON column as stored (nlohmann dump); empty or unreadable text reads as null.
inline Json ParseStored(const std::string& text) {
  if (text.empty()) return nullptr;
  auto j = ParseJson(text);
  return j.ok() ? std::move(*j) : Json(nullptr);
}

inline constexpr const char* kTenantCols = "id, name, created_at, allow_host_exec, allow_stdio_mcp";
template <typename Row>
Tenant ReadTenant(const Row& r) {
  Tenant t{r.Text(0), r.Text(1), r.Int(2)};
  t.allow_host_exec = r.Int(3) != 0;
  t.allow_stdio_mcp = r.Int(4) != 0;
  return t;
}

inline constexpr const char* kTokenCols =
    "id, tenant_id, name, role, hash, created_at, revoked_at, parent_id, expires_at, user_id";
template <typename Row>
Token ReadToken(const Row& s) {
  Token t;
  t.id = s.Text(0);
  t.tenant_id = s.Text(1);
  t.name = s.Text(2);
  t.role = s.Text(3);
  t.hash = s.Text(4);
  t.created_at = s.Int(5);
  t.revoked_at = s.OptInt(6);
  t.parent_id = s.Text(7);
  t.expires_at = s.OptInt(8);
  t.user_id = s.Text(9);
  return t;
}

inline constexpr const char* kTenantKeyCols = "tenant_id, wrapped, kek_fingerprint, created_at";
template <typename Row>
TenantKey ReadTenantKey(const Row& s) {
  return TenantKey{s.Text(0), s.Text(1), s.Text(2), s.Int(3)};
}

inline constexpr const char* kSecretCols = "tenant_id, name, sealed, created_at, updated_at";
template <typename Row>
Secret ReadSecret(const Row& s) {
  return Secret{s.Text(0), s.Text(1), s.Text(2), s.Int(3), s.Int(4)};
}

inline constexpr const char* kPolicyCols = "tenant_id, scope, body, updated_at";
template <typename Row>
PolicyDoc ReadPolicy(const Row& s) {
  return PolicyDoc{s.Text(0), s.Text(1), ParseStored(s.Text(2)), s.Int(3)};
}

inline constexpr const char* kStopCols = "tenant_id, agent_id, reason, created_by, created_at";
template <typename Row>
EmergencyStop ReadStop(const Row& s) {
  return EmergencyStop{s.Text(0), s.Text(1), s.Text(2), s.Text(3), s.Int(4)};
}

inline constexpr const char* kApprovalCols =
    "id, tenant_id, run_id, session_id, agent_id, call_id, tool, arguments, amended_arguments, "
    "reason, status, requested_by, decided_by, decision_reason, created_at, expires_at, "
    "decided_at";
template <typename Row>
Approval ReadApproval(const Row& s) {
  Approval a;
  a.id = s.Text(0);
  a.tenant_id = s.Text(1);
  a.run_id = s.Text(2);
  a.session_id = s.Text(3);
  a.agent_id = s.Text(4);
  a.call_id = s.Text(5);
  a.tool = s.Text(6);
  a.arguments = ParseStored(s.Text(7));
  a.amended_arguments = ParseStored(s.Text(8));
  a.reason = s.Text(9);
  a.status = s.Text(10);
  a.requested_by = s.Text(11);
  a.decided_by = s.Text(12);
  a.decision_reason = s.Text(13);
  a.created_at = s.Int(14);
  a.expires_at = s.Int(15);
  a.decided_at = s.OptInt(16);
  return a;
}

inline constexpr const char* kStandingCols =
    "id, tenant_id, agent_id, tool, arguments_match, created_by, approval_id, created_at, "
    "expires_at, revoked_at";
template <typename Row>
StandingApproval ReadStanding(const Row& s) {
  StandingApproval a;
  a.id = s.Text(0);
  a.tenant_id = s.Text(1);
  a.agent_id = s.Text(2);
  a.tool = s.Text(3);
  a.arguments_match = ParseStored(s.Text(4));
  a.created_by = s.Text(5);
  a.approval_id = s.Text(6);
  a.created_at = s.Int(7);
  a.expires_at = s.Int(8);
  a.revoked_at = s.OptInt(9);
  return a;
}

inline constexpr const char* kMcpServerCols =
    "id, tenant_id, name, transport, config, created_at";
template <typename Row>
McpServer ReadMcpServer(const Row& s) {
  return McpServer{s.Text(0), s.Text(1), s.Text(2), s.Text(3), ParseStored(s.Text(4)), s.Int(5)};
}

inline constexpr const char* kPluginCols =
    "tenant_id, id, name, version, kind, manifest, source, config, created_at, updated_at";
template <typename Row>
Plugin ReadPlugin(const Row& s) {
  Plugin p;
  p.tenant_id = s.Text(0);
  p.id = s.Text(1);
  p.name = s.Text(2);
  p.version = s.Text(3);
  p.kind = s.Text(4);
  p.manifest = ParseStored(s.Text(5));
  p.source = s.Text(6);
  p.config = ParseStored(s.Text(7));
  p.created_at = s.Int(8);
  p.updated_at = s.Int(9);
  return p;
}

inline constexpr const char* kEnablementCols = "tenant_id, plugin_id, agent_id, created_at";
template <typename Row>
PluginEnablement ReadEnablement(const Row& s) {
  return PluginEnablement{s.Text(0), s.Text(1), s.Text(2), s.Int(3)};
}

inline constexpr const char* kChannelCols =
    "id, tenant_id, agent_id, kind, name, settings, enabled, created_by, created_at, updated_at";
template <typename Row>
Channel ReadChannel(const Row& r) {
  Channel c;
  c.id = r.Text(0);
  c.tenant_id = r.Text(1);
  c.agent_id = r.Text(2);
  c.kind = r.Text(3);
  c.name = r.Text(4);
  c.settings = r.Text(5);
  c.enabled = r.Int(6) != 0;
  c.created_by = r.Text(7);
  c.created_at = r.Int(8);
  c.updated_at = r.Int(9);
  return c;
}

inline constexpr const char* kUserCols = "id, tenant_id, name, merged_into, created_at, updated_at";
template <typename Row>
User ReadUser(const Row& r) {
  return User{r.Text(0), r.Text(1), r.Text(2), r.Text(3), r.Int(4), r.Int(5)};
}

inline constexpr const char* kIdentityCols =
    "tenant_id, platform, platform_user_id, user_id, name, created_at";
template <typename Row>
Identity ReadIdentity(const Row& r) {
  return Identity{r.Text(0), r.Text(1), r.Text(2), r.Text(3), r.Text(4), r.Int(5)};
}

inline constexpr const char* kMemberCols =
    "tenant_id, agent_id, user_id, role, created_at, updated_at";
template <typename Row>
AgentMember ReadMember(const Row& r) {
  return AgentMember{r.Text(0), r.Text(1), r.Text(2), r.Text(3), r.Int(4), r.Int(5)};
}

inline constexpr const char* kReplyCols =
    "id, tenant_id, channel_id, agent_id, session_id, run_id, delivery_id, target, status, "
    "text, parts_sent, attempts, next_attempt_at, origin, error, created_at, updated_at, "
    "approval_id, user_id, message";
template <typename Row>
ChannelReply ReadReply(const Row& r) {
  ChannelReply x;
  x.id = r.Text(0);
  x.tenant_id = r.Text(1);
  x.channel_id = r.Text(2);
  x.agent_id = r.Text(3);
  x.session_id = r.Text(4);
  x.run_id = r.Text(5);
  x.delivery_id = r.Text(6);
  x.target = r.Text(7);
  x.status = r.Text(8);
  x.text = r.Text(9);
  x.parts_sent = static_cast<int>(r.Int(10));
  x.attempts = static_cast<int>(r.Int(11));
  x.next_attempt_at = r.Int(12);
  x.origin = r.Text(13);
  x.error = r.Text(14);
  x.created_at = r.Int(15);
  x.updated_at = r.Int(16);
  x.approval_id = r.Text(17);
  x.user_id = r.Text(18);
  x.message = r.Text(19);
  return x;
}

inline constexpr const char* kDeliveryCols =
    "id, tenant_id, plugin_id, agent_id, event_type, payload, status, attempts, "
    "next_attempt_at, last_status, last_error, created_at, delivered_at";
template <typename Row>
PluginDelivery ReadDelivery(const Row& s) {
  PluginDelivery d;
  d.id = s.Text(0);
  d.tenant_id = s.Text(1);
  d.plugin_id = s.Text(2);
  d.agent_id = s.Text(3);
  d.event_type = s.Text(4);
  d.payload = ParseStored(s.Text(5));
  d.status = s.Text(6);
  d.attempts = static_cast<int>(s.Int(7));
  d.next_attempt_at = s.Int(8);
  d.last_status = static_cast<int>(s.Int(9));
  d.last_error = s.Text(10);
  d.created_at = s.Int(11);
  d.delivered_at = s.OptInt(12);
  return d;
}

// ListDeliveries pages newest first, so its cursor is the last item's (created_at, id), as
// "MILLIS:ID" before EncodeCursor.
inline std::string DeliveryCursorKey(const PluginDelivery& d) {
  return std::to_string(d.created_at) + ":" + d.id;
}
// The (created_at, id) a page of deliveries starts below: the top for an empty cursor.
inline Result<std::pair<Millis, std::string>> DeliveryCursorStart(const std::string& cursor) {
  if (cursor.empty()) return std::pair<Millis, std::string>(INT64_MAX, "");
  const std::string key = DecodeCursor(cursor);
  const size_t colon = key.find(':');
  Millis at = 0;
  if (colon == std::string::npos || colon == 0) return InvalidArgument("cursor is not valid");
  auto [end, ec] = std::from_chars(key.data(), key.data() + colon, at);
  if (ec != std::errc() || end != key.data() + colon) return InvalidArgument("cursor is not valid");
  return std::pair<Millis, std::string>(at, key.substr(colon + 1));
}

// `cols` ("a, b") with each column named through `alias` ("x.a, x.b"), for a join.
inline std::string Qualified(const char* cols, const char* alias) {
  std::string out = std::string(alias) + ".";
  for (; *cols; ++cols) {
    if (*cols == ' ') continue;
    out += *cols;
    if (*cols == ',') out += std::string(" ") + alias + ".";
  }
  return out;
}

// A row read from its column `offset` on, so that a row reader of this file reads the columns
// of a join after the first table's.
template <typename Row>
struct Shifted {
  const Row& row;
  int offset;
  std::string Text(int col) const { return row.Text(offset + col); }
  int64_t Int(int col) const { return row.Int(offset + col); }
  std::optional<int64_t> OptInt(int col) const { return row.OptInt(offset + col); }
};

inline constexpr const char* kAgentCols =
    "id, tenant_id, name, model, instructions, tools, config, status, created_at, updated_at";
template <typename Row>
Agent ReadAgent(const Row& s) {
  Agent a;
  a.id = s.Text(0);
  a.tenant_id = s.Text(1);
  a.name = s.Text(2);
  a.model = s.Text(3);
  a.instructions = s.Text(4);
  a.tools = ParseStored(s.Text(5));
  a.config = ParseStored(s.Text(6));
  a.status = s.Text(7);
  a.created_at = s.Int(8);
  a.updated_at = s.Int(9);
  return a;
}

inline constexpr const char* kSessionCols =
    "id, tenant_id, agent_id, status, title, created_at, updated_at, description, created_by, "
    "instructions";
// How many columns a list of them has (its commas and one), for columns selected after it.
constexpr int ColumnCount(const char* cols) {
  int n = 1;
  for (; *cols; ++cols) n += *cols == ',' ? 1 : 0;
  return n;
}
inline constexpr int kSessionColCount = ColumnCount(kSessionCols);
inline constexpr int kAgentColCount = ColumnCount(kAgentCols);
template <typename Row>
Session ReadSession(const Row& s) {
  Session x;
  x.id = s.Text(0);
  x.tenant_id = s.Text(1);
  x.agent_id = s.Text(2);
  x.status = s.Text(3);
  x.title = s.Text(4);
  x.created_at = s.Int(5);
  x.updated_at = s.Int(6);
  x.description = s.Text(7);
  x.created_by = s.Text(8);
  x.instructions = s.Text(9);
  return x;
}

inline constexpr const char* kMessageCols =
    "id, tenant_id, session_id, run_id, role, content, idempotency_key, created_at";
// A message as read, with its seq (which the store gives it when it is inserted).
inline constexpr const char* kMessageReadCols =
    "id, tenant_id, session_id, run_id, role, content, idempotency_key, created_at, seq";
// What a turn's context needs of a message (ConversationSince): each turn reads the session's
// conversation, so the other columns are not copied out for it.
inline constexpr const char* kConversationCols = "id, role, content, seq";
template <typename Row>
Message ReadConversationMessage(const Row& s) {
  Message m;
  m.id = s.Text(0);
  m.role = s.Text(1);
  m.content = s.Text(2);
  m.seq = s.Int(3);
  return m;
}
template <typename Row>
Message ReadMessage(const Row& s) {
  Message m;
  m.id = s.Text(0);
  m.tenant_id = s.Text(1);
  m.session_id = s.Text(2);
  m.run_id = s.Text(3);
  m.role = s.Text(4);
  m.content = s.Text(5);
  m.idempotency_key = s.Text(6);
  m.created_at = s.Int(7);
  m.seq = s.Int(8);
  return m;
}

inline constexpr const char* kRunCols =
    "id, tenant_id, session_id, agent_id, message_id, status, attempt, output, error, "
    "input_tokens, output_tokens, lease_owner, lease_expires_at, cancel_requested, created_at, "
    "started_at, finished_at, requested_by, caller_role, user_id, channel_id";
template <typename Row>
Run ReadRun(const Row& s) {
  Run r;
  r.id = s.Text(0);
  r.tenant_id = s.Text(1);
  r.session_id = s.Text(2);
  r.agent_id = s.Text(3);
  r.message_id = s.Text(4);
  r.status = s.Text(5);
  r.attempt = static_cast<int>(s.Int(6));
  r.output = s.Text(7);
  r.error = ParseStored(s.Text(8));
  r.input_tokens = s.Int(9);
  r.output_tokens = s.Int(10);
  r.lease_owner = s.Text(11);
  r.lease_expires_at = s.Int(12);
  r.cancel_requested = s.Int(13) != 0;
  r.created_at = s.Int(14);
  r.started_at = s.OptInt(15);
  r.finished_at = s.OptInt(16);
  r.requested_by = s.Text(17);
  r.caller_role = s.Text(18);
  r.user_id = s.Text(19);
  r.channel_id = s.Text(20);
  return r;
}

inline constexpr const char* kStepCols =
    "id, tenant_id, run_id, seq, kind, status, input, output, started_at, finished_at";
template <typename Row>
Step ReadStep(const Row& s) {
  Step x;
  x.id = s.Text(0);
  x.tenant_id = s.Text(1);
  x.run_id = s.Text(2);
  x.seq = static_cast<int>(s.Int(3));
  x.kind = s.Text(4);
  x.status = s.Text(5);
  x.input = ParseStored(s.Text(6));
  x.output = ParseStored(s.Text(7));
  x.started_at = s.Int(8);
  x.finished_at = s.OptInt(9);
  return x;
}

inline constexpr const char* kToolCallCols =
    "id, tenant_id, run_id, step_id, call_id, tool, arguments, effect_class, effect_key, status, "
    "result, created_at, updated_at";
template <typename Row>
ToolCall ReadToolCall(const Row& s) {
  ToolCall c;
  c.id = s.Text(0);
  c.tenant_id = s.Text(1);
  c.run_id = s.Text(2);
  c.step_id = s.Text(3);
  c.call_id = s.Text(4);
  c.tool = s.Text(5);
  c.arguments = ParseStored(s.Text(6));
  c.effect_class = s.Text(7);
  c.effect_key = s.Text(8);
  c.status = s.Text(9);
  c.result = ParseStored(s.Text(10));
  c.created_at = s.Int(11);
  c.updated_at = s.Int(12);
  return c;
}

// An Event's position is the tenant's (tenant_position); the store-wide key stays inside.
inline constexpr const char* kEventCols =
    "tenant_position, id, tenant_id, type, origin, origin_seq, agent_id, session_id, run_id, "
    "payload, occurred_at";
// All but the payload (column 9), which the audit chain hashes as stored.
template <typename Row>
Event ReadEventHead(const Row& s) {
  Event e;
  e.position = s.Int(0);
  e.id = s.Text(1);
  e.tenant_id = s.Text(2);
  e.type = s.Text(3);
  e.origin = s.Text(4);
  e.origin_seq = s.Int(5);
  e.agent_id = s.Text(6);
  e.session_id = s.Text(7);
  e.run_id = s.Text(8);
  e.occurred_at = s.Int(10);
  return e;
}
template <typename Row>
Event ReadEvent(const Row& s) {
  Event e = ReadEventHead(s);
  e.payload = ParseStored(s.Text(9));
  return e;
}

inline constexpr const char* kMemoryCols =
    "id, tenant_id, agent_id, text, tags, source, created_at, updated_at";
template <typename Row>
Memory ReadMemory(const Row& s) {
  Memory m;
  m.id = s.Text(0);
  m.tenant_id = s.Text(1);
  m.agent_id = s.Text(2);
  m.text = s.Text(3);
  m.tags = ParseStored(s.Text(4));
  if (!m.tags.is_array()) m.tags = Json::array();
  m.source = s.Text(5);
  m.created_at = s.Int(6);
  m.updated_at = s.Int(7);
  return m;
}

// ListMemories pages newest first: its cursor is the last item's (updated_at, id), as
// DeliveryCursorKey's is.
inline std::string MemoryCursorKey(const Memory& m) {
  return std::to_string(m.updated_at) + ":" + m.id;
}

// The columns of an exported table, as a SELECT or INSERT lists them.
inline std::string ColumnList(const ExportTableSpec& t) {
  std::string out;
  for (const auto& c : t.columns) out += (out.empty() ? "" : ", ") + std::string(c.name);
  return out;
}

// The exported table named `table`, or kInvalidArgument.
inline Result<const ExportTableSpec*> ExportTableOf(const std::string& table) {
  const ExportTableSpec* spec = FindExportTable(table);
  if (!spec) return InvalidArgument("not an exported table: " + table);
  return spec;
}

// "$1,$2,...,$n": the parameters of an INSERT's VALUES.
inline std::string Placeholders(int n) {
  std::string out;
  for (int i = 1; i <= n; ++i) out += (i > 1 ? ",$" : "$") + std::to_string(i);
  return out;
}

// A list page's size: 1 to 500 items.
inline int ClampLimit(int limit) { return std::clamp(limit, 1, 500); }

// The most a page of large items (messages) holds in their bytes: a page ends after the item
// that reaches it, with a cursor for the rest, however many items `limit` allowed (500
// messages of 1 MiB each made one 500 MiB response, built on the io thread). SqlTx's PageOf.
inline constexpr size_t kMaxPageBytes = 4u << 20;

}  // namespace keel::store::rows
