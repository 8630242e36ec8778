#include "keel/store/row_images.h"

#include "keel/store/store.h"

namespace keel::store {

namespace {

// An image's JSON text, column by column (no Json value is built: a turn writes several).
class Image {
 public:
  Image& Text(const char* column, std::string_view v) {
    Key(column);
    AppendJsonString(out_, v);
    return *this;
  }
  Image& Int(const char* column, int64_t v) {
    Key(column);
    out_ += std::to_string(v);
    return *this;
  }
  Image& OptInt(const char* column, const std::optional<Millis>& v) {
    Key(column);
    out_ += v ? std::to_string(*v) : std::string("null");
    return *this;
  }
  Image& Col(const char* column, std::string_view v) { return Text(column, v); }
  Image& Col(const char* column, int64_t v) { return Int(column, v); }
  // A JSON column: its stored text, as a string.
  Image& JsonText(const char* column, const Json& v) { return Text(column, DumpJson(v)); }
  Image& StoredText(const char* column, const Json& v) { return Text(column, StoredJson(v)); }
  std::string Done() {
    out_ += '}';
    return std::move(out_);
  }

 private:
  void Key(const char* column) {
    out_ += out_.size() == 1 ? "\"" : ",\"";
    out_ += column;
    out_ += "\":";
  }
  std::string out_ = "{";
};

}  // namespace

std::string StoredJson(const Json& j) { return j.is_null() ? std::string() : DumpJson(j); }

std::string RowImage(const Tenant& t) {
  return Image()
      .Col("id", t.id)
      .Col("name", t.name)
      .Col("created_at", t.created_at)
      .Int("allow_host_exec", t.allow_host_exec ? 1 : 0)
      .Int("allow_stdio_mcp", t.allow_stdio_mcp ? 1 : 0)
      .Done();
}

std::string RowImage(const Token& t) {
  return Image()
      .Col("id", t.id)
      .Col("tenant_id", t.tenant_id)
      .Col("name", t.name)
      .Col("role", t.role)
      .Col("hash", t.hash)
      .Col("created_at", t.created_at)
      .OptInt("revoked_at", t.revoked_at)
      .Col("parent_id", t.parent_id)
      .OptInt("expires_at", t.expires_at)
      .Col("user_id", t.user_id)
      .Done();
}

std::string RowImage(const Agent& a) {
  return Image()
      .Col("id", a.id)
      .Col("tenant_id", a.tenant_id)
      .Col("name", a.name)
      .Col("model", a.model)
      .Col("instructions", a.instructions)
      .JsonText("tools", a.tools)
      .JsonText("config", a.config)
      .Col("status", a.status)
      .Col("created_at", a.created_at)
      .Col("updated_at", a.updated_at)
      .Done();
}

std::string RowImage(const Session& s) {
  return Image()
      .Col("id", s.id)
      .Col("tenant_id", s.tenant_id)
      .Col("agent_id", s.agent_id)
      .Col("status", s.status)
      .Col("title", s.title)
      .Col("created_at", s.created_at)
      .Col("updated_at", s.updated_at)
      .Col("description", s.description)
      .Col("created_by", s.created_by)
      .Col("instructions", s.instructions)
      .Done();
}

std::string SessionStatusImage(const std::string& session_id, const std::string& status,
                               Millis at) {
  return Image().Col("id", session_id).Col("status", status).Col("updated_at", at).Done();
}

std::string RowImage(const Message& m) {
  return Image()
      .Col("id", m.id)
      .Col("tenant_id", m.tenant_id)
      .Col("session_id", m.session_id)
      .Col("run_id", m.run_id)
      .Col("role", m.role)
      .Col("content", m.content)
      .Col("idempotency_key", m.idempotency_key)
      .Col("created_at", m.created_at)
      .Done();
}

namespace {

// The columns of a run that its UPDATE writes (WriteRun on both backends): all of an update's
// image, and the rest of the whole row's.
std::string WithRunState(Image& image, const Run& r) {
  return image.Col("status", r.status)
      .Col("attempt", r.attempt)
      .Col("output", r.output)
      .StoredText("error", r.error)
      .Col("input_tokens", r.input_tokens)
      .Col("output_tokens", r.output_tokens)
      .Col("lease_owner", r.lease_owner)
      .Col("lease_expires_at", r.lease_expires_at)
      .Int("cancel_requested", r.cancel_requested ? 1 : 0)
      .OptInt("started_at", r.started_at)
      .OptInt("finished_at", r.finished_at)
      .Done();
}

}  // namespace

std::string RowImage(const Run& r) {
  Image image;
  image.Col("id", r.id)
      .Col("tenant_id", r.tenant_id)
      .Col("session_id", r.session_id)
      .Col("agent_id", r.agent_id)
      .Col("message_id", r.message_id)
      .Col("created_at", r.created_at)
      .Col("requested_by", r.requested_by)
      .Col("caller_role", r.caller_role)
      .Col("user_id", r.user_id)
      .Col("channel_id", r.channel_id);
  return WithRunState(image, r);
}

std::string RunUpdateImage(const Run& r) {
  Image image;
  image.Col("id", r.id);
  return WithRunState(image, r);
}

std::string RunEndImage(const Run& r) {
  return Image()
      .Col("id", r.id)
      .Col("status", r.status)
      .Col("output", r.output)
      .StoredText("error", r.error)
      .Col("input_tokens", r.input_tokens)
      .Col("output_tokens", r.output_tokens)
      .OptInt("finished_at", r.finished_at)
      .Col("lease_expires_at", static_cast<int64_t>(0))
      .Done();
}

std::string StepUpdateImage(const Step& s) {
  return Image()
      .Col("id", s.id)
      .Col("status", s.status)
      .JsonText("input", s.input)
      .JsonText("output", s.output)
      .OptInt("finished_at", s.finished_at)
      .Done();
}

std::string ToolCallUpdateImage(const ToolCall& c) {
  return Image()
      .Col("id", c.id)
      .Col("status", c.status)
      .JsonText("arguments", c.arguments)
      .JsonText("result", c.result)
      .Col("updated_at", c.updated_at)
      .Done();
}

std::string RowImage(const Step& s) {
  return Image()
      .Col("id", s.id)
      .Col("tenant_id", s.tenant_id)
      .Col("run_id", s.run_id)
      .Col("seq", s.seq)
      .Col("kind", s.kind)
      .Col("status", s.status)
      .JsonText("input", s.input)
      .JsonText("output", s.output)
      .Col("started_at", s.started_at)
      .OptInt("finished_at", s.finished_at)
      .Done();
}

std::string RowImage(const ToolCall& c) {
  return Image()
      .Col("id", c.id)
      .Col("tenant_id", c.tenant_id)
      .Col("run_id", c.run_id)
      .Col("step_id", c.step_id)
      .Col("call_id", c.call_id)
      .Col("tool", c.tool)
      .JsonText("arguments", c.arguments)
      .Col("effect_class", c.effect_class)
      .Col("effect_key", c.effect_key)
      .Col("status", c.status)
      .JsonText("result", c.result)
      .Col("created_at", c.created_at)
      .Col("updated_at", c.updated_at)
      .Done();
}

std::string RowImage(const Approval& a) {
  return Image()
      .Col("id", a.id)
      .Col("tenant_id", a.tenant_id)
      .Col("run_id", a.run_id)
      .Col("session_id", a.session_id)
      .Col("agent_id", a.agent_id)
      .Col("call_id", a.call_id)
      .Col("tool", a.tool)
      .JsonText("arguments", a.arguments)
      .StoredText("amended_arguments", a.amended_arguments)
      .Col("reason", a.reason)
      .Col("status", a.status)
      .Col("requested_by", a.requested_by)
      .Col("decided_by", a.decided_by)
      .Col("decision_reason", a.decision_reason)
      .Col("created_at", a.created_at)
      .Col("expires_at", a.expires_at)
      .OptInt("decided_at", a.decided_at)
      .Done();
}

std::string RowImage(const StandingApproval& a) {
  return Image()
      .Col("id", a.id)
      .Col("tenant_id", a.tenant_id)
      .Col("agent_id", a.agent_id)
      .Col("tool", a.tool)
      .StoredText("arguments_match", a.arguments_match)
      .Col("created_by", a.created_by)
      .Col("approval_id", a.approval_id)
      .Col("created_at", a.created_at)
      .Col("expires_at", a.expires_at)
      .OptInt("revoked_at", a.revoked_at)
      .Done();
}

std::string RowImage(const PolicyDoc& p) {
  return Image()
      .Col("tenant_id", p.tenant_id)
      .Col("scope", p.scope)
      .JsonText("body", p.body)
      .Col("updated_at", p.updated_at)
      .Done();
}

std::string RowImage(const EmergencyStop& s) {
  return Image()
      .Col("tenant_id", s.tenant_id)
      .Col("agent_id", s.agent_id)
      .Col("reason", s.reason)
      .Col("created_by", s.created_by)
      .Col("created_at", s.created_at)
      .Done();
}

std::string RowImage(const TenantKey& k) {
  return Image()
      .Col("tenant_id", k.tenant_id)
      .Col("wrapped", k.wrapped)
      .Col("kek_fingerprint", k.kek_fingerprint)
      .Col("created_at", k.created_at)
      .Done();
}

std::string RowImage(const Secret& s) {
  return Image()
      .Col("tenant_id", s.tenant_id)
      .Col("name", s.name)
      .Col("sealed", s.sealed)
      .Col("created_at", s.created_at)
      .Col("updated_at", s.updated_at)
      .Done();
}

std::string RowImage(const McpServer& m) {
  return Image()
      .Col("id", m.id)
      .Col("tenant_id", m.tenant_id)
      .Col("name", m.name)
      .Col("transport", m.transport)
      .JsonText("config", m.config)
      .Col("created_at", m.created_at)
      .Done();
}

std::string RowImage(const Plugin& p) {
  return Image()
      .Col("tenant_id", p.tenant_id)
      .Col("id", p.id)
      .Col("name", p.name)
      .Col("version", p.version)
      .Col("kind", p.kind)
      .JsonText("manifest", p.manifest)
      .Col("source", p.source)
      .JsonText("config", p.config)
      .Col("created_at", p.created_at)
      .Col("updated_at", p.updated_at)
      .Done();
}

std::string RowImage(const PluginEnablement& e) {
  return Image()
      .Col("tenant_id", e.tenant_id)
      .Col("plugin_id", e.plugin_id)
      .Col("agent_id", e.agent_id)
      .Col("created_at", e.created_at)
      .Done();
}

std::string RowImage(const Schedule& s) {
  return Image()
      .Col("id", s.id)
      .Col("tenant_id", s.tenant_id)
      .Col("agent_id", s.agent_id)
      .Col("name", s.name)
      .Col("kind", s.kind)
      .Col("cron", s.cron)
      .OptInt("at", s.at)
      .Col("timezone", s.timezone)
      .Col("prompt", s.prompt)
      .Col("session_id", s.session_id)
      .Col("missed", s.missed)
      .Col("status", s.status)
      .OptInt("next_fire_at", s.next_fire_at)
      .OptInt("last_fired_at", s.last_fired_at)
      .Col("created_by", s.created_by)
      .Col("caller_role", s.caller_role)
      .Col("created_at", s.created_at)
      .Col("updated_at", s.updated_at)
      .Col("user_id", s.user_id)
      .Col("channel_id", s.channel_id)
      .Done();
}

std::string RowImage(const Channel& c) {
  return Image()
      .Col("id", c.id)
      .Col("tenant_id", c.tenant_id)
      .Col("agent_id", c.agent_id)
      .Col("kind", c.kind)
      .Col("name", c.name)
      .Col("settings", c.settings)
      .Int("enabled", c.enabled ? 1 : 0)
      .Col("created_by", c.created_by)
      .Col("created_at", c.created_at)
      .Col("updated_at", c.updated_at)
      .Done();
}

std::string RowImage(const ChannelConversation& c) {
  return Image()
      .Col("tenant_id", c.tenant_id)
      .Col("channel_id", c.channel_id)
      .Col("conversation", c.conversation)
      .Col("session_id", c.session_id)
      .Col("created_at", c.created_at)
      .Col("contact", c.contact)
      .Done();
}

std::string RowImage(const ChannelDelivery& d) {
  return Image()
      .Col("tenant_id", d.tenant_id)
      .Col("channel_id", d.channel_id)
      .Col("delivery_id", d.delivery_id)
      .Col("session_id", d.session_id)
      .Col("created_at", d.created_at)
      .Done();
}

std::string RowImage(const User& u) {
  return Image()
      .Col("id", u.id)
      .Col("tenant_id", u.tenant_id)
      .Col("name", u.name)
      .Col("merged_into", u.merged_into)
      .Col("created_at", u.created_at)
      .Col("updated_at", u.updated_at)
      .Done();
}

std::string RowImage(const Identity& i) {
  return Image()
      .Col("tenant_id", i.tenant_id)
      .Col("platform", i.platform)
      .Col("platform_user_id", i.platform_user_id)
      .Col("user_id", i.user_id)
      .Col("name", i.name)
      .Col("created_at", i.created_at)
      .Done();
}

std::string RowImage(const AgentMember& m) {
  return Image()
      .Col("tenant_id", m.tenant_id)
      .Col("agent_id", m.agent_id)
      .Col("user_id", m.user_id)
      .Col("role", m.role)
      .Col("created_at", m.created_at)
      .Col("updated_at", m.updated_at)
      .Done();
}

std::string RowImage(const AgentAccess& a) {
  return Image()
      .Col("tenant_id", a.tenant_id)
      .Col("agent_id", a.agent_id)
      .Col("level", a.level)
      .Int("code_set", a.code_set ? 1 : 0)
      .Col("updated_at", a.updated_at)
      .Col("guest_daily_tokens", a.guest_daily_tokens)
      .Done();
}

std::string RowImage(const ScheduleFire& f) {
  return Image()
      .Col("tenant_id", f.tenant_id)
      .Col("schedule_id", f.schedule_id)
      .Col("slot", f.slot)
      .Col("fired_at", f.fired_at)
      .Col("outcome", f.outcome)
      .Col("session_id", f.session_id)
      .Col("run_id", f.run_id)
      .Col("message_id", f.message_id)
      .Col("error", f.error)
      .Done();
}

std::string RowImage(const Memory& m) {
  return Image()
      .Col("id", m.id)
      .Col("tenant_id", m.tenant_id)
      .Col("agent_id", m.agent_id)
      .Col("text", m.text)
      .JsonText("tags", m.tags)
      .Col("source", m.source)
      .Col("created_at", m.created_at)
      .Col("updated_at", m.updated_at)
      .Done();
}

std::string RowImage(const WorkingMemory& w) {
  return Image()
      .Col("tenant_id", w.tenant_id)
      .Col("agent_id", w.agent_id)
      .Col("text", w.text)
      .Col("updated_at", w.updated_at)
      .Done();
}

std::string RowImage(const Skill& s) {
  return Image()
      .Col("tenant_id", s.tenant_id)
      .Col("name", s.name)
      .Col("description", s.description)
      .Col("hash", s.hash)
      .Col("bytes", s.bytes)
      .JsonText("manifest", s.manifest)
      .Col("created_at", s.created_at)
      .Col("updated_at", s.updated_at)
      .JsonText("files", s.files)
      .Done();
}

std::string RowImage(const SkillAssignment& a) {
  return Image()
      .Col("tenant_id", a.tenant_id)
      .Col("agent_id", a.agent_id)
      .Col("skill", a.skill)
      .Col("created_at", a.created_at)
      .Done();
}

std::string RowImage(const Compaction& c) {
  return Image()
      .Col("id", c.id)
      .Col("tenant_id", c.tenant_id)
      .Col("session_id", c.session_id)
      .Col("run_id", c.run_id)
      .Col("last_message_id", c.last_message_id)
      .Col("summary", c.summary)
      .Col("messages", c.messages)
      .Col("tokens_before", c.tokens_before)
      .Col("tokens_after", c.tokens_after)
      .Col("created_at", c.created_at)
      .Done();
}

std::string RowImage(const Budget& b) {
  return Image()
      .Col("tenant_id", b.tenant_id)
      .Col("scope", b.scope)
      .Col("period", b.period)
      .Col("limit_micros", b.limit_micros)
      .Col("created_at", b.created_at)
      .Col("updated_at", b.updated_at)
      .Done();
}

std::string RowImage(const UsageRecord& u) {
  return Image()
      .Col("id", u.id)
      .Col("tenant_id", u.tenant_id)
      .Col("agent_id", u.agent_id)
      .Col("run_id", u.run_id)
      .Col("step_id", u.step_id)
      .Col("model", u.model)
      .Col("input_tokens", u.input_tokens)
      .Col("output_tokens", u.output_tokens)
      .Col("cost_micros", u.cost_micros)
      .Col("saved_micros", u.saved_micros)
      .Int("cached", u.cached ? 1 : 0)
      .Int("fallback", u.fallback ? 1 : 0)
      .Col("created_at", u.created_at)
      .Done();
}

std::string ColumnsImage(const Json& columns) { return DumpJson(columns); }

std::string DeletedImage(Json key) {
  key[kDeletedMarker] = true;
  return DumpJson(key);
}

void Tx::Carry(const char* table, std::string image) {
  carried_.emplace_back(table, std::move(image));
}

Status Tx::AppendCarried(std::string& payload) {
  if (carried_.empty()) return Status::Ok();
  if (payload.size() < 2 || payload.back() != '}') {
    carried_.clear();
    return Internal("an event's payload is not an object: it cannot carry row images");
  }
  // "rows":{"TABLE":[IMAGE,...],...}, tables in the order the unit first wrote them.
  std::string rows = std::string(",\"") + kRowsField + "\":{";
  std::vector<bool> taken(carried_.size(), false);
  for (size_t i = 0; i < carried_.size(); ++i) {
    if (taken[i]) continue;
    if (rows.back() != '{') rows += ',';
    rows += '"';
    rows += carried_[i].first;
    rows += "\":[";
    for (size_t j = i; j < carried_.size(); ++j) {
      if (taken[j] || std::string_view(carried_[j].first) != carried_[i].first) continue;
      if (j != i) rows += ',';
      rows += carried_[j].second;
      taken[j] = true;
    }
    rows += ']';
  }
  rows += "}}";
  payload.pop_back();
  if (payload == "{") rows.erase(0, 1);  // no member before it
  payload += rows;
  carried_.clear();
  return Status::Ok();
}

Status Tx::CarriedAll() {
  if (carried_.empty()) return Status::Ok();
  std::string tables;
  for (const auto& [table, _] : carried_) {
    if (tables.find(table) == std::string::npos)
      tables += (tables.empty() ? "" : ", ") + std::string(table);
  }
  carried_.clear();
  return Internal("a unit of work wrote rows of " + tables +
                  " and appended no event after them to carry their images");
}

const std::vector<std::string>& RebuiltTables() {
  // Every exported table but the log itself (events, audit_heads), which a rebuild copies.
  static const std::vector<std::string> kTables = [] {
    std::vector<std::string> tables;
    for (const auto& spec : ExportTables()) {
      const std::string name = spec.name;
      if (name != "events" && name != "audit_heads") tables.push_back(name);
    }
    return tables;
  }();
  return kTables;
}

}  // namespace keel::store
