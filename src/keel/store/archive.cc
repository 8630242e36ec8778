#include "keel/store/archive.h"

#include <archive.h>
#include <archive_entry.h>

#include <filesystem>
#include <map>
#include <memory>
#include <set>

#include "keel/common/crypto.h"
#include "keel/common/json_util.h"
#include "keel/common/time.h"
#include "keel/store/audit.h"

namespace keel::store {
namespace {

// Columns that tables gained after their own first version: the rows of an older archive lack
// them and import with `value`.
struct AddedColumn {
  const char* table;
  const char* column;
  int version;        // the archive version that first carried it
  const char* value;  // JSON text
};
constexpr AddedColumn kAddedColumns[] = {{"sessions", "description", 5, "\"\""},
                                         {"sessions", "created_by", 6, "\"\""},
                                         {"sessions", "instructions", 9, "\"\""},
                                         {"tenants", "allow_host_exec", 6, "0"},
                                         {"tenants", "allow_stdio_mcp", 6, "0"},
                                         {"events", "hash", 7, "\"\""},
                                         {"api_tokens", "parent_id", 10, "\"\""},
                                         {"api_tokens", "expires_at", 10, "null"},
                                         {"api_tokens", "user_id", 12, "\"\""},
                                         {"channel_conversations", "contact", 13, "\"\""},
                                         {"agent_access", "guest_daily_tokens", 13, "200000"},
                                         {"schedules", "user_id", 14, "\"\""},
                                         {"schedules", "channel_id", 15, "\"\""},
                                         {"runs", "user_id", 16, "\"\""},
                                         {"runs", "channel_id", 16, "\"\""}};

constexpr const char* kManifest = "manifest.json";

struct ArchiveFree {
  void operator()(struct archive* a) const {
    if (a) archive_free(a);  // closes first when still open
  }
};
using ArchivePtr = std::unique_ptr<struct archive, ArchiveFree>;

Status ArchiveError(struct archive* a, const std::string& what) {
  const char* msg = archive_error_string(a);
  return InvalidArgument(what + ": " + (msg ? msg : "unknown libarchive error"));
}

std::string EntryName(const ExportTableSpec& t) { return std::string(t.name) + ".jsonl"; }

// The archive version that first carried `t`: archives of an earlier version lack it. Tables not
// named here are in every version ImportArchive reads.
int FirstVersionOf(const ExportTableSpec& t) {
  static const std::map<std::string, int> kAdded = {{"plugins", 3},
                                                    {"agent_plugins", 3},
                                                    {"schedules", 4},
                                                    {"schedule_fires", 4},
                                                    {"memories", 4},
                                                    {"working_memories", 4},
                                                    {"skills", 4},
                                                    {"agent_skills", 4},
                                                    {"compactions", 4},
                                                    {"budgets", 4},
                                                    {"model_usage", 4},
                                                    {"usage_totals", 4},
                                                    {"audit_heads", 7},
                                                    {"channels", 11},
                                                    {"channel_conversations", 11},
                                                    {"channel_deliveries", 11},
                                                    {"users", 12},
                                                    {"identities", 12},
                                                    {"agent_members", 12},
                                                    {"agent_access", 12}};
  auto it = kAdded.find(t.name);
  return it == kAdded.end() ? kOldestArchiveVersion : it->second;
}

// Events of archives before version 7 carry the store-wide origin_seq and no tenant_position:
// both are numbered per tenant here, in the order the events were written (rows come in
// position order; each origin wrote its events in origin_seq order), as the store migration
// numbers existing events. Rows that are not well-formed are left for CheckExportRow to refuse.
class EventNumbering {
 public:
  void Fill(int version, Json& row) {
    if (version >= 7 || !row.is_object() || row.contains("tenant_position")) return;
    auto tenant = row.find("tenant_id");
    auto origin = row.find("origin");
    if (tenant == row.end() || !tenant->is_string() || origin == row.end() ||
        !origin->is_string() || !row.contains("origin_seq")) {
      return;
    }
    const std::string& t = tenant->get_ref<const std::string&>();
    row["tenant_position"] = ++positions_[t];
    row["origin_seq"] = ++seqs_[{t, origin->get_ref<const std::string&>()}];
  }

 private:
  std::map<std::string, int64_t> positions_;
  std::map<std::pair<std::string, std::string>, int64_t> seqs_;
};

// Messages of archives before version 8 carry no seq: numbered per session in id order (rows
// come in id order), as the store migration numbers existing messages. From version 8 a seq is
// a positive integer, one message's in its session (the store's unique index would refuse it
// only at the insert, as a conflict). Rows that are not well-formed otherwise are left for
// CheckExportRow to refuse.
class MessageNumbering {
 public:
  Status Fill(int version, Json& row) {
    if (!row.is_object()) return Status::Ok();
    auto session = row.find("session_id");
    if (session == row.end() || !session->is_string()) return Status::Ok();
    const std::string& s = session->get_ref<const std::string&>();
    if (version < 8) {
      if (!row.contains("seq")) row["seq"] = ++seqs_[s];
      return Status::Ok();
    }
    auto seq = row.find("seq");
    if (seq == row.end() || !seq->is_number_integer()) return Status::Ok();
    const int64_t n = seq->get<int64_t>();
    if (n < 1) return InvalidArgument("field 'seq' must be at least 1");
    if (!seen_.insert({s, n}).second) {
      return InvalidArgument("two messages of session " + s + " have seq " + std::to_string(n));
    }
    return Status::Ok();
  }

 private:
  std::map<std::string, int64_t> seqs_;
  std::set<std::pair<std::string, int64_t>> seen_;
};

Status WriteEntry(struct archive* a, const std::string& name, const std::string& data,
                  Millis mtime) {
  std::unique_ptr<archive_entry, decltype(&archive_entry_free)> e(archive_entry_new(),
                                                                  &archive_entry_free);
  archive_entry_set_pathname(e.get(), name.c_str());
  archive_entry_set_filetype(e.get(), AE_IFREG);
  archive_entry_set_perm(e.get(), 0600);
  archive_entry_set_size(e.get(), static_cast<la_int64_t>(data.size()));
  archive_entry_set_mtime(e.get(), mtime / 1000, 0);
  if (archive_write_header(a, e.get()) != ARCHIVE_OK) return ArchiveError(a, "writing " + name);
  if (!data.empty() &&
      archive_write_data(a, data.data(), data.size()) != static_cast<la_ssize_t>(data.size())) {
    return ArchiveError(a, "writing " + name);
  }
  return Status::Ok();
}

Status WriteArchive(const std::string& path, const std::string& manifest,
                    const std::vector<std::string>& contents, Millis now) {
  ArchivePtr a(archive_write_new());
  if (archive_write_add_filter_zstd(a.get()) != ARCHIVE_OK ||
      archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK) {
    return Internal(ArchiveError(a.get(), "libarchive").message());
  }
  if (archive_write_open_filename(a.get(), path.c_str()) != ARCHIVE_OK) {
    return ArchiveError(a.get(), "cannot write " + path);
  }
  KEEL_RETURN_IF_ERROR(WriteEntry(a.get(), kManifest, manifest, now));
  for (size_t i = 0; i < ExportTables().size(); ++i) {
    KEEL_RETURN_IF_ERROR(WriteEntry(a.get(), EntryName(ExportTables()[i]), contents[i], now));
  }
  if (archive_write_close(a.get()) != ARCHIVE_OK) {
    return ArchiveError(a.get(), "cannot write " + path);
  }
  return Status::Ok();
}

// Every entry of the archive at `path`, in order, as (name, content).
Result<std::vector<std::pair<std::string, std::string>>> ReadEntries(const std::string& path) {
  ArchivePtr a(archive_read_new());
  archive_read_support_filter_zstd(a.get());
  archive_read_support_format_tar(a.get());
  if (archive_read_open_filename(a.get(), path.c_str(), 1 << 16) != ARCHIVE_OK) {
    return ArchiveError(a.get(), "cannot open " + path);
  }
  std::vector<std::pair<std::string, std::string>> entries;
  size_t total = 0;
  while (true) {
    archive_entry* e = nullptr;
    int rc = archive_read_next_header(a.get(), &e);
    if (rc == ARCHIVE_EOF) break;
    if (rc != ARCHIVE_OK) return ArchiveError(a.get(), path + ": bad or truncated archive");
    if (archive_entry_filetype(e) != AE_IFREG) {
      return InvalidArgument(path + ": unexpected entry " + archive_entry_pathname(e));
    }
    std::string name = archive_entry_pathname(e);
    std::string data;
    char buf[1 << 16];
    while (true) {
      la_ssize_t n = archive_read_data(a.get(), buf, sizeof buf);
      if (n < 0) return ArchiveError(a.get(), path + ": bad or truncated entry " + name);
      if (n == 0) break;
      total += static_cast<size_t>(n);
      if (total > kMaxArchiveBytes) {  // a small archive may inflate to anything
        return InvalidArgument(path + ": the archive holds more than " +
                               std::to_string(kMaxArchiveBytes >> 20) + " MiB uncompressed");
      }
      data.append(buf, static_cast<size_t>(n));
    }
    entries.emplace_back(std::move(name), std::move(data));
  }
  if (archive_read_close(a.get()) != ARCHIVE_OK) {
    return ArchiveError(a.get(), path + ": bad or truncated archive");
  }
  return entries;
}

// Splits `data` into its lines; each must end with '\n'.
Result<std::vector<std::string_view>> Lines(const std::string& name, const std::string& data) {
  std::vector<std::string_view> lines;
  std::string_view rest = data;
  while (!rest.empty()) {
    size_t nl = rest.find('\n');
    if (nl == std::string_view::npos) {
      return InvalidArgument(name + ": line " + std::to_string(lines.size() + 1) +
                             " does not end with a newline");
    }
    lines.push_back(rest.substr(0, nl));
    rest.remove_prefix(nl + 1);
  }
  return lines;
}

}  // namespace

void FillAddedColumns(const ExportTableSpec& t, int version, Json& row) {
  for (const auto& c : kAddedColumns) {
    if (version < c.version && t.name == std::string_view(c.table) && row.is_object() &&
        !row.contains(c.column)) {
      row[c.column] = Json::parse(c.value);
    }
  }
}

Status ExportArchive(Store& store, const std::string& tenant_id, const std::string& path) {
  Json tenant = nullptr;
  std::vector<std::string> contents;
  Json tables = Json::object();
  KEEL_RETURN_IF_ERROR(store.Read([&](Tx& tx) -> Status {
    if (!tenant_id.empty()) {
      KEEL_ASSIGN_OR_RETURN(Tenant t, tx.tenants().GetTenant(tenant_id));
      tenant = Json{{"id", t.id}, {"name", t.name}, {"created_at", t.created_at}};
    }
    for (const auto& spec : ExportTables()) {
      std::string data;
      int64_t rows = 0;
      KEEL_RETURN_IF_ERROR(tx.exports().ExportTable(tenant_id, spec.name, [&](const Json& row) {
        data += DumpJson(row);
        data += '\n';
        ++rows;
        return Status::Ok();
      }));
      tables[spec.name] = Json{{"rows", rows}, {"sha256", Sha256Hex(data)}};
      contents.push_back(std::move(data));
    }
    return Status::Ok();
  }));

  Millis now = NowMillis();
  Json manifest = {{"format", kArchiveFormat},
                   {"version", kArchiveVersion},
                   {"tenant", tenant},
                   {"tables", tables},
                   {"created_at", now}};

  // Written beside `path` and renamed into place, so a failed export leaves no partial archive.
  const std::string partial = path + ".partial";
  Status st = WriteArchive(partial, manifest.dump(2) + "\n", contents, now);
  std::error_code ec;
  if (st.ok()) {
    std::filesystem::rename(partial, path, ec);
    if (ec) st = InvalidArgument("cannot write " + path + ": " + ec.message());
  }
  if (!st.ok()) std::filesystem::remove(partial, ec);
  return st;
}

Status ImportArchive(Store& store, const std::string& path, const std::string& audit_key) {
  KEEL_ASSIGN_OR_RETURN(auto entries, ReadEntries(path));
  if (entries.empty() || entries[0].first != kManifest) {
    return InvalidArgument(path + ": not a Keel export (its first entry is not manifest.json)");
  }
  auto parsed = ParseJsonObject(entries[0].second);
  if (!parsed.ok()) return InvalidArgument(path + ": manifest.json: " + parsed.status().message());
  const Json& manifest = *parsed;
  if (manifest.value("format", Json()) != kArchiveFormat) {
    return InvalidArgument(path + ": not a Keel export (format is not \"keel-export\")");
  }
  const Json version_json = manifest.value("version", Json());
  if (!version_json.is_number_integer() || version_json.get<int64_t>() < kOldestArchiveVersion ||
      version_json.get<int64_t>() > kArchiveVersion) {
    return InvalidArgument(path + ": unsupported export version " + version_json.dump() +
                           " (this Keel reads versions " + std::to_string(kOldestArchiveVersion) +
                           " to " + std::to_string(kArchiveVersion) + ")");
  }
  const int version = static_cast<int>(version_json.get<int64_t>());
  const Json tables = manifest.value("tables", Json());
  if (!tables.is_object()) return InvalidArgument(path + ": manifest.json lacks \"tables\"");

  // The tables an archive of this version has: exactly those, each with its entry.
  std::set<std::string> expected;
  for (const auto& spec : ExportTables()) {
    if (FirstVersionOf(spec) <= version) expected.insert(spec.name);
  }
  for (const auto& [name, _] : tables.items()) {
    if (!expected.count(name)) return InvalidArgument(path + ": unknown table " + name);
  }
  std::map<std::string, const std::string*> files;
  for (size_t i = 1; i < entries.size(); ++i) {
    const std::string& name = entries[i].first;
    bool known = name.size() > 6 && name.ends_with(".jsonl") &&
                 expected.count(name.substr(0, name.size() - 6));
    if (!known) return InvalidArgument(path + ": unexpected entry " + name);
    if (!files.emplace(name, &entries[i].second).second) {
      return InvalidArgument(path + ": duplicate entry " + name);
    }
  }

  // Every row parsed and checked before anything is written.
  std::vector<std::pair<const ExportTableSpec*, std::vector<Json>>> rows;
  for (const auto& spec : ExportTables()) {
    if (!expected.count(spec.name)) continue;  // newer than the archive: imports as empty
    const std::string entry = EntryName(spec);
    auto meta = tables.find(spec.name);
    if (meta == tables.end() || !meta->is_object()) {
      return InvalidArgument(path + ": manifest.json lacks table " + spec.name);
    }
    auto file = files.find(entry);
    if (file == files.end()) return InvalidArgument(path + ": missing entry " + entry);
    const std::string& data = *file->second;
    if (meta->value("sha256", Json()) != Sha256Hex(data)) {
      return InvalidArgument(path + ": " + entry + " does not match its sha256 in the manifest");
    }
    KEEL_ASSIGN_OR_RETURN(auto lines, Lines(entry, data));
    const Json count = meta->value("rows", Json());
    if (!count.is_number_integer() || count.get<int64_t>() != static_cast<int64_t>(lines.size())) {
      return InvalidArgument(path + ": " + entry + " has " + std::to_string(lines.size()) +
                             " rows, the manifest says " + count.dump());
    }
    auto& table_rows = rows.emplace_back(&spec, std::vector<Json>()).second;
    table_rows.reserve(lines.size());
    EventNumbering numbering;
    MessageNumbering message_numbering;
    for (size_t i = 0; i < lines.size(); ++i) {
      auto parsed = ParseJson(lines[i]);
      Json row = parsed.ok() ? std::move(*parsed) : Json();
      if (parsed.ok()) FillAddedColumns(spec, version, row);
      if (parsed.ok() && spec.name == std::string_view("events")) numbering.Fill(version, row);
      Status st = parsed.status();
      if (st.ok() && spec.name == std::string_view("messages")) {
        st = message_numbering.Fill(version, row);
      }
      if (st.ok()) st = CheckExportRow(spec, row);
      if (!st.ok()) {
        return InvalidArgument(path + ": " + entry + " line " + std::to_string(i + 1) + ": " +
                               st.message());
      }
      table_rows.push_back(std::move(row));
    }
  }

  // The audit chains (from version 7): every event's hash recomputed along its chain and each
  // head's signature checked under this store's key, so an archive changed after its export
  // (rows edited, removed or moved, its checksums recomputed) is refused. Older archives carry
  // no chains: their events are hashed as they are imported.
  if (version >= 7) {
    ChainVerifier verifier(audit_key);
    for (const auto& [spec, table_rows] : rows) {
      if (spec->name == std::string_view("events")) {
        for (const auto& row : table_rows) verifier.AddEvent(row);
      } else if (spec->name == std::string_view("audit_heads")) {
        for (const auto& row : table_rows) verifier.AddHead(row);
      }
    }
    if (Status trusted = verifier.Trusted(); !trusted.ok()) {
      return InvalidArgument(path + ": " + trusted.message());
    }
  }

  return store.WriteSync([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(bool empty, tx.exports().IsEmpty());
    if (!empty) return Conflict("the store is not empty; import only into a new store");
    for (const auto& [spec, table_rows] : rows) {
      for (size_t i = 0; i < table_rows.size(); ++i) {
        Status st = tx.exports().ImportRow(spec->name, table_rows[i]);
        if (!st.ok()) {
          return Status(st.code(), std::string("importing ") + spec->name + " row " +
                                       std::to_string(i + 1) + ": " + st.message());
        }
      }
    }
    return tx.exports().FinishImport();
  });
}

}  // namespace keel::store
