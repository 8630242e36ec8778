#pragma once
// Row images: the state an event carries, so that the event log alone rebuilds the tables
// (store/rebuild.h, DESIGN.md invariant 2).
//
// A unit of work that writes a row of a table the log rebuilds (RebuiltTables()) adds the row's
// image to the payload of an event it appends in the same unit, under "rows":
//   {"...": ..., "rows": {"runs": [{"id": "...", "status": "done", ...}], "sessions": [...]}}
// An image is an object named like the table's columns, in the export format (store.h,
// ExportTables: JSON-text columns as their stored text). It holds the row's key columns and
// any others: a whole row when it is written whole, or only what changed (a session's status
// and updated_at). Replaying the images in event order, each merged into the row of its key,
// gives the table. Derived columns are left out and recomputed on replay (messages.seq).
//
// "rows" is the log's own record: the API's views of an event (EventJson) leave it out for
// every role, so streams show what they showed before (decisions/0012).

#include <string>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/store/channel_store.h"
#include "keel/store/compaction_store.h"
#include "keel/store/memory_store.h"
#include "keel/store/schedule_store.h"
#include "keel/store/skill_store.h"
#include "keel/store/types.h"
#include "keel/store/usage_store.h"
#include "keel/store/user_store.h"

namespace keel::store {

// The payload member that holds the images.
inline constexpr const char* kRowsField = "rows";

// A JSON column's stored text: "" for null, else the JSON (both backends store it so).
std::string StoredJson(const Json& j);

// The images are JSON text (an object), written column by column without building a Json value.

std::string RowImage(const Tenant& t);
std::string RowImage(const Token& t);
std::string RowImage(const Agent& a);
std::string RowImage(const Session& s);
std::string RowImage(
    const Message& m);  // without seq: replay numbers a session's messages in order
std::string RowImage(const Run& r);
std::string RowImage(const Step& s);
std::string RowImage(const ToolCall& c);
std::string RowImage(const Approval& a);
std::string RowImage(const StandingApproval& a);
std::string RowImage(const PolicyDoc& p);
std::string RowImage(const EmergencyStop& s);
std::string RowImage(const TenantKey& k);
std::string RowImage(const Secret& s);
std::string RowImage(const McpServer& m);
std::string RowImage(const Plugin& p);
std::string RowImage(const PluginEnablement& e);
std::string RowImage(const Schedule& s);
std::string RowImage(const ScheduleFire& f);
std::string RowImage(const Memory& m);
std::string RowImage(const WorkingMemory& w);
std::string RowImage(const Skill& s);
std::string RowImage(const SkillAssignment& a);
std::string RowImage(const Compaction& c);
std::string RowImage(const Budget& b);
std::string RowImage(const Channel& c);
std::string RowImage(const ChannelConversation& c);
std::string RowImage(const ChannelDelivery& d);
std::string RowImage(const User& u);
std::string RowImage(const Identity& i);
std::string RowImage(const AgentMember& m);
std::string RowImage(const AgentAccess& a);
// A model call's usage; replay adds it to usage_totals, which is their sum.
std::string RowImage(const UsageRecord& u);
// An image of some columns: a row's key columns and those a write changed.
std::string ColumnsImage(const Json& columns);
// The key of a row the unit deleted: replay removes it (and what goes with it, rebuild.h).
// `key` holds the table's key columns (its primary key).
std::string DeletedImage(Json key);
// The marker DeletedImage sets.
inline constexpr const char* kDeletedMarker = "$deleted";
// What RunStore::UpdateRun, UpdateStep and UpdateToolCall write: the key and the columns those
// updates set (the others never change after the insert).
std::string RunUpdateImage(const Run& r);
// What RunStore::EndHeldRun writes.
std::string RunEndImage(const Run& r);
std::string StepUpdateImage(const Step& s);
std::string ToolCallUpdateImage(const ToolCall& c);
// Only a session's status and updated_at, as UpdateSessionStatus writes them.
std::string SessionStatusImage(const std::string& session_id, const std::string& status, Millis at);

// The tables whose every write carries its image: every exported table (ExportTables) but the
// log's own, events and audit_heads. usage_totals is rebuilt from model_usage.
const std::vector<std::string>& RebuiltTables();


}  // namespace keel::store
