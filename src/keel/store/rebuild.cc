#include "keel/store/rebuild.h"

#include <algorithm>
#include <set>
#include <unordered_map>
#include <utility>

#include "keel/model/metering.h"
#include "keel/store/archive.h"
#include "keel/store/audit.h"
#include "keel/store/row_images.h"

namespace keel::store {

namespace {

// A table being rebuilt: its rows by key, in key order.
struct Table {
  const ExportTableSpec* spec = nullptr;
  std::vector<std::string> key;  // KeyColumns
  std::map<std::string, Json> rows;
};

// Tables whose upsert keeps a row's created_at when it replaces the row, and those whose insert
// of an existing row changes nothing (as the backends write them).
bool KeepsCreatedAt(std::string_view table) {
  return table == "secrets" || table == "skills" || table == "plugins" || table == "budgets" ||
         table == "memories";
}
// The columns of `spec.order_by`.
std::vector<std::string> OrderColumns(const ExportTableSpec& spec) {
  std::vector<std::string> out;
  std::string_view cols = spec.order_by;
  while (!cols.empty()) {
    size_t comma = cols.find(',');
    std::string_view col = cols.substr(0, comma);
    while (!col.empty() && col.front() == ' ') col.remove_prefix(1);
    out.emplace_back(col);
    if (comma == std::string_view::npos) break;
    cols.remove_prefix(comma + 1);
  }
  return out;
}

// A table's key columns: its primary key, which is its export order but for memories.
std::vector<std::string> KeyColumns(const std::string& table) {
  if (table == "memories") return {"tenant_id", "id"};
  const ExportTableSpec* spec = FindExportTable(table);
  return spec ? OrderColumns(*spec) : std::vector<std::string>();
}

bool InsertsOnce(std::string_view table) {
  return table == "agent_plugins" || table == "agent_skills";
}

class Fold {
 public:
  Fold() {
    for (const auto& name : RebuiltTables()) {
      Table& t = tables_[name];
      t.spec = FindExportTable(name);
      t.key = KeyColumns(name);
    }
  }

  // Merges the images of one event (of `type`, in `tenant`'s log, its payload parsed) into the
  // tables. An event rebuilds its own tenant's rows only.
  Status Apply(int64_t position, const std::string& tenant, const std::string& type,
               const Json& payload) {
    auto rows = payload.find(kRowsField);
    if (rows == payload.end()) return Status::Ok();
    ++with_rows_;
    if (!rows->is_object()) return Bad(position, "\"rows\" is not an object");
    for (const auto& [name, images] : rows->items()) {
      auto t = tables_.find(name);
      if (t == tables_.end() || name == "usage_totals") {
        return Bad(position, "images of a table not rebuilt from them: " + name);
      }
      if (!images.is_array()) return Bad(position, name + " images are not an array");
    }
    // One event's tables parents first (the archive's order), whatever order its JSON object
    // keeps them in; each table's images in the order the unit wrote them.
    for (const auto& spec : ExportTables()) {
      auto images = rows->find(spec.name);
      if (images == rows->end()) continue;
      if (std::string_view(spec.name) == "tenants" && type == "tenant.created@v1") {
        for (const auto& image : *images) {
          if (image.is_object()) tenants_.insert(image.value("id", ""));
        }
      }
      for (const auto& image : *images) {
        KEEL_RETURN_IF_ERROR(Merge(position, tenant, spec.name, tables_[spec.name], image));
      }
    }
    return Status::Ok();
  }

  // Every tenant's whole history is in the log: its first event, tenant.created@v1, carried its
  // row (a store whose tenants were created before events carried row images is refused
  // rather than rebuilt without the rows only older events wrote).
  Status Complete(const std::set<std::string>& event_tenants) const {
    for (const auto& tenant : event_tenants) {
      if (!tenants_.count(tenant)) {
        return InvalidArgument("tenant " + tenant +
                               " was created before events carried row images: its tables "
                               "cannot be rebuilt from its events");
      }
    }
    return Status::Ok();
  }

  // Gives every row the columns its table gained after the row's last image was written, with
  // the value a migration gave existing rows (as an older archive's rows import), then checks
  // that each row is whole, as an archive's rows are checked.
  Status FillAndCheck() {
    for (auto& [name, table] : tables_) {
      for (auto& [key, row] : table.rows) {
        FillAddedColumns(*table.spec, 0, row);
        Status st = CheckExportRow(*table.spec, row);
        if (!st.ok()) {
          return InvalidArgument("the event log does not hold the whole " + name + " row " + key +
                                 " (" + st.message() +
                                 "): it was written before events carried row images, or an "
                                 "image is malformed");
        }
      }
    }
    return Status::Ok();
  }

  const std::map<std::string, Table>& tables() const { return tables_; }
  int64_t with_rows() const { return with_rows_; }

 private:
  static Status Bad(int64_t position, const std::string& what) {
    return InvalidArgument("event at position " + std::to_string(position) + ": " + what);
  }

  // The key's columns' values, joined; empty when the image lacks one.
  static std::string KeyOf(const Table& table, const Json& image) {
    std::string key;
    for (const auto& col : table.key) {
      auto v = image.find(col);
      if (v == image.end() || !(v->is_string() || v->is_number_integer())) return std::string();
      if (!key.empty()) key += '/';
      key += v->is_string() ? v->get<std::string>() : std::to_string(v->get<int64_t>());
    }
    return key;
  }

  // Merges one image into its row. The image, and the row it changes, must be of `tenant`
  // (the event's): one tenant's log never writes another's rows.
  Status Merge(int64_t position, const std::string& tenant, const std::string& name,
               Table& table, const Json& image) {
    if (!image.is_object()) return Bad(position, name + " image is not an object");
    const std::string key = KeyOf(table, image);
    if (key.empty()) return Bad(position, name + " image lacks its key");
    const char* owner = name == "tenants" ? "id" : "tenant_id";
    auto row = table.rows.find(key);
    if ((image.contains(owner) && image[owner] != Json(tenant)) ||
        (row != table.rows.end() && row->second.value(owner, Json()) != Json(tenant))) {
      return Bad(position, name + " row " + key + " is not of the event's tenant " + tenant);
    }
    if (image.value(kDeletedMarker, false)) {
      table.rows.erase(key);
      Cascade(name, image);
      return Status::Ok();
    }
    auto [it, created] = table.rows.try_emplace(key, image);
    if (!created) {
      if (InsertsOnce(name)) return Status::Ok();
      const bool keep_created = KeepsCreatedAt(name);
      for (const auto& [column, value] : image.items()) {
        if (keep_created && column == "created_at") continue;
        it->second[column] = value;
      }
      return Status::Ok();
    }
    if (name == "messages" && !image.contains("seq")) {
      // A session's messages are numbered in commit order, which is the log's order.
      const Json& session = image.value("session_id", Json());
      if (session.is_string()) it->second["seq"] = ++message_seq_[session.get<std::string>()];
    } else if (name == "model_usage" && !AddToTotals(image)) {
      return Bad(position, "model_usage row " + key +
                               " does not add up (a time before 1970, or totals past 2^63)");
    }
    return Status::Ok();
  }

  // What goes with a deleted row: a plugin's enablements and a skill's assignments (ON DELETE
  // CASCADE), a schedule's fires (ScheduleStore::DeleteSchedule), a channel's conversations
  // and deliveries (ChannelStore::DeleteChannel).
  void Cascade(const std::string& name, const Json& image) {
    struct Child {
      const char* parent;
      const char* table;
      const char* column;      // the child's column naming the parent
      const char* parent_key;  // the parent's column it names
    };
    static const Child kChildren[] = {{"plugins", "agent_plugins", "plugin_id", "id"},
                                      {"skills", "agent_skills", "skill", "name"},
                                      {"schedules", "schedule_fires", "schedule_id", "id"},
                                      {"channels", "channel_conversations", "channel_id", "id"},
                                      {"channels", "channel_deliveries", "channel_id", "id"}};
    for (const Child& c : kChildren) {
      if (name != c.parent) continue;
      auto t = tables_.find(c.table);
      if (t == tables_.end()) continue;
      const Json parent = image.value(c.parent_key, Json());
      const Json tenant = image.value("tenant_id", Json());
      std::erase_if(t->second.rows, [&](const auto& kv) {
        return kv.second.value(c.column, Json()) == parent &&
               (tenant.is_null() || kv.second.value("tenant_id", Json()) == tenant);
      });
    }
  }

  // usage_totals: each call's usage summed per tenant (agent_id "") and agent, per UTC day and
  // month, as UsageStore::InsertUsage adds it. False for a time before 1970 or a sum past 2^63
  // (a forged image).
  bool AddToTotals(const Json& u) {
    bool fits = true;
    Table& totals = tables_["usage_totals"];
    const Millis at = u.value("created_at", int64_t(0));
    if (at < 0) return false;
    const std::string agent = u.value("agent_id", "");
    for (const char* period : {model::kPeriodDay, model::kPeriodMonth}) {
      for (const std::string& agent_id : {agent, std::string()}) {
        Json key = {{"tenant_id", u.value("tenant_id", "")},
                    {"agent_id", agent_id},
                    {"period", period},
                    {"period_start", model::PeriodStart(period, at)}};
        auto [it, created] = totals.rows.try_emplace(KeyOf(totals, key), key);
        Json& row = it->second;
        auto add = [&](const char* column, int64_t v) {
          int64_t sum = 0;
          if (__builtin_add_overflow(created ? 0 : row.value(column, int64_t(0)), v, &sum)) {
            fits = false;
          }
          row[column] = sum;
        };
        add("calls", 1);
        add("cached_calls", u.value("cached", int64_t(0)) != 0 ? 1 : 0);
        add("input_tokens", u.value("input_tokens", int64_t(0)));
        add("output_tokens", u.value("output_tokens", int64_t(0)));
        add("cost_micros", u.value("cost_micros", int64_t(0)));
        add("saved_micros", u.value("saved_micros", int64_t(0)));
      }
    }
    return fits;
  }

  std::map<std::string, Table> tables_;
  std::set<std::string> tenants_;  // tenants whose creation carried their row
  std::unordered_map<std::string, int64_t> message_seq_;
  int64_t with_rows_ = 0;
};

}  // namespace

Result<RebuildReport> RebuildFromEvents(Store& from, Store& into, const std::string& audit_key) {
  for (const auto& name : RebuiltTables()) {
    if (!FindExportTable(name)) return Internal("table " + name + " is not exported");
  }
  Fold fold;
  std::vector<Json> events;
  std::vector<Json> heads;
  std::set<std::string> event_tenants;
  KEEL_RETURN_IF_ERROR(from.Read([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.exports().ExportTable("", "events", [&](const Json& row) -> Status {
      const Json& text = row.value("payload", Json());
      const int64_t position = row.value("position", int64_t(0));
      auto payload = text.is_string() ? ParseJson(text.get<std::string>())
                                      : Result<Json>(InvalidArgument("no payload"));
      if (!payload.ok()) {
        return InvalidArgument("event at position " + std::to_string(position) +
                               ": unreadable payload: " + payload.status().message());
      }
      if (payload->is_object()) {
        KEEL_RETURN_IF_ERROR(
            fold.Apply(position, row.value("tenant_id", ""), row.value("type", ""), *payload));
      }
      event_tenants.insert(row.value("tenant_id", ""));
      events.push_back(row);
      return Status::Ok();
    }));
    return tx.exports().ExportTable("", "audit_heads", [&](const Json& row) -> Status {
      heads.push_back(row);
      return Status::Ok();
    });
  }));
  // The log is trusted only as far as its audit chains hold (as an archive's on import).
  ChainVerifier verifier(audit_key);
  for (const auto& row : events) verifier.AddEvent(row);
  for (const auto& row : heads) verifier.AddHead(row);
  if (Status trusted = verifier.Trusted(); !trusted.ok()) {
    return InvalidArgument(trusted.message() + "; the log is not rebuilt from");
  }
  KEEL_RETURN_IF_ERROR(fold.Complete(event_tenants));
  KEEL_RETURN_IF_ERROR(fold.FillAndCheck());

  RebuildReport report;
  report.events = static_cast<int64_t>(events.size());
  report.events_with_rows = fold.with_rows();
  std::set<std::string> written = {"events", "audit_heads"};
  for (const auto& [name, table] : fold.tables()) {
    report.rows[name] = static_cast<int64_t>(table.rows.size());
    written.insert(name);
  }
  for (const auto& spec : ExportTables()) {
    if (!written.count(spec.name)) report.not_rebuilt.push_back(spec.name);
  }
  KEEL_RETURN_IF_ERROR(into.WriteSync([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(bool empty, tx.exports().IsEmpty());
    if (!empty) return Conflict("the target store is not empty; rebuild only into a new store");
    // Parents before children, in the archive's order.
    for (const auto& spec : ExportTables()) {
      const std::string name = spec.name;
      const std::vector<Json>* copied = name == "events"        ? &events
                                        : name == "audit_heads" ? &heads
                                                                : nullptr;
      if (copied) {
        for (const auto& row : *copied) KEEL_RETURN_IF_ERROR(tx.exports().ImportRow(name, row));
        continue;
      }
      auto t = fold.tables().find(name);
      if (t == fold.tables().end()) continue;
      // In the table's export order, as `keel import` writes an archive's rows: where the
      // backends number rows as they are inserted (memories' recency), the numbers follow it.
      std::vector<const std::pair<const std::string, Json>*> ordered;
      for (const auto& entry : t->second.rows) ordered.push_back(&entry);
      const std::vector<std::string> order = OrderColumns(spec);
      std::stable_sort(ordered.begin(), ordered.end(), [&](const auto* a, const auto* b) {
        for (const auto& col : order) {
          const Json& x = a->second.value(col, Json());
          const Json& y = b->second.value(col, Json());
          if (x != y) return x < y;
        }
        return false;
      });
      for (const auto* entry : ordered) {
        Status st = tx.exports().ImportRow(name, entry->second);
        if (!st.ok()) {
          return Status(st.code(),
                        "writing " + name + " row " + entry->first + ": " + st.message());
        }
      }
    }
    return tx.exports().FinishImport();
  }));
  return report;
}

}  // namespace keel::store
