// keel export / keel import (store/archive.h): an archive written from SQLite, imported into
// PostgreSQL (or a second SQLite file without KEEL_TEST_PG_ADMIN_URL) and exported again has the
// same bytes; a bad archive or a non-empty store is refused and nothing is written.

#include "keel/store/archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <gtest/gtest.h>

#include <functional>

#include <filesystem>
#include <map>
#include <set>
#include <fstream>
#include <sstream>

#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/store/store.h"
#include "pg_test_database.h"

namespace keel::store {
namespace {

namespace fs = std::filesystem;
using Entries = std::vector<std::pair<std::string, std::string>>;

Entries ReadArchive(const std::string& path) {
  Entries out;
  struct archive* a = archive_read_new();
  archive_read_support_filter_all(a);
  archive_read_support_format_all(a);
  EXPECT_EQ(archive_read_open_filename(a, path.c_str(), 1 << 16), ARCHIVE_OK);
  archive_entry* e = nullptr;
  while (archive_read_next_header(a, &e) == ARCHIVE_OK) {
    std::string data;
    char buf[4096];
    la_ssize_t n;
    while ((n = archive_read_data(a, buf, sizeof buf)) > 0) data.append(buf, n);
    out.emplace_back(archive_entry_pathname(e), std::move(data));
  }
  archive_read_free(a);
  return out;
}

void WriteArchive(const std::string& path, const Entries& entries) {
  struct archive* a = archive_write_new();
  archive_write_add_filter_zstd(a);
  archive_write_set_format_pax_restricted(a);
  ASSERT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK);
  for (const auto& [name, data] : entries) {
    archive_entry* e = archive_entry_new();
    archive_entry_set_pathname(e, name.c_str());
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0600);
    archive_entry_set_size(e, static_cast<la_int64_t>(data.size()));
    archive_write_header(a, e);
    archive_write_data(a, data.data(), data.size());
    archive_entry_free(e);
  }
  archive_write_close(a);
  archive_write_free(a);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A store on a fresh database: PostgreSQL when `postgres`, else a SQLite file in `dir`.
struct TestStore {
  PgTestDatabase pg;
  std::unique_ptr<Store> store;
};

std::unique_ptr<TestStore> OpenTestStore(bool postgres, const fs::path& dir) {
  auto t = std::make_unique<TestStore>();
  std::string url;
  if (postgres) {
    Status st = t->pg.Create();
    EXPECT_TRUE(st.ok()) << st.ToString();
    url = t->pg.url();
  } else {
    url = "sqlite://" + (dir / (NewId() + ".db")).string();
  }
  StoreOptions o;
  o.origin = "node-a";
  auto s = OpenStore(url, o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (s.ok()) t->store = std::move(s).value();
  return t;
}

bool IsEmpty(Store& store) {
  bool empty = false;
  Status st = store.Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(empty, tx.exports().IsEmpty());
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
  return empty;
}

// One tenant's worth of everything: tokens, an agent, a session, messages, a run with a model
// step and a tool step with its tool call, events, and two plugins enabled (one with a webhook
// delivery, which is not exported).
Status Fill(Store& store, const std::string& tenant_id) {
  return store.WriteSync([&](Tx& tx) -> Status {
    Millis now = NowMillis();
    KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant({tenant_id, "Tenant " + tenant_id, now}));
    const std::string owner = NewId();
    KEEL_RETURN_IF_ERROR(
        tx.tokens().InsertToken({owner, tenant_id, "owner", "owner", NewId(), now, {}, "", {}}));
    KEEL_RETURN_IF_ERROR(tx.tokens().InsertToken(
        {NewId(), tenant_id, "old", "user", NewId(), now, now + 5, "", {}}));
    // A dashboard sign-in: its parent and expiry travel too.
    KEEL_RETURN_IF_ERROR(tx.tokens().InsertToken(
        {NewId(), tenant_id, "dashboard sign-in", "owner", NewId(), now, {}, owner, now + 9}));
    Agent a;
    a.id = NewId();
    a.tenant_id = tenant_id;
    a.name = "helper";
    a.model = "local";
    a.instructions = "Be \"brief\".\nÜmlauts ok.";
    a.tools = Json::array({"keel.tool.time_now"});
    a.config = Json{{"z", 1}, {"a", Json{{"nested", true}}}};
    a.created_at = a.updated_at = now;
    KEEL_RETURN_IF_ERROR(tx.agents().InsertAgent(a));
    Session s{NewId(), tenant_id, a.id, "idle", "first chat", now, now};
    KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(s));
    Run r;
    r.id = NewId();
    r.tenant_id = tenant_id;
    r.session_id = s.id;
    r.agent_id = a.id;
    r.status = "done";
    r.attempt = 1;
    r.output = "It is noon.";
    r.input_tokens = 12;
    r.output_tokens = 5;
    r.created_at = now;
    r.started_at = now + 1;
    r.finished_at = now + 2;
    Message m1{NewId(), tenant_id, s.id, r.id, "user", "What time is it?", "key-1", now};
    Message m2{NewId(), tenant_id, s.id, r.id, "assistant", "It is noon.", "", now + 2};
    r.message_id = m1.id;
    KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(m1));
    KEEL_RETURN_IF_ERROR(tx.runs().InsertRun(r));
    KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(m2));
    Step model{NewId(),
               tenant_id,
               r.id,
               1,
               "model",
               "succeeded",
               Json{{"messages", 2}},
               Json{{"text", ""}},
               now,
               now + 1};
    Step tool{NewId(), tenant_id,   r.id,           2,
              "tool",  "succeeded", Json::object(), Json{{"time", "12:00"}},
              now + 1, std::nullopt};
    KEEL_RETURN_IF_ERROR(tx.runs().InsertStep(model));
    KEEL_RETURN_IF_ERROR(tx.runs().InsertStep(tool));
    ToolCall c;
    c.id = NewId();
    c.tenant_id = tenant_id;
    c.run_id = r.id;
    c.step_id = tool.id;
    c.call_id = "call_1";
    c.tool = "keel.tool.time_now";
    c.effect_class = "pure";
    c.status = "succeeded";
    c.result = Json{{"time", "12:00"}};
    c.created_at = c.updated_at = now;
    KEEL_RETURN_IF_ERROR(tx.runs().InsertToolCall(c));
    Plugin lua;
    lua.tenant_id = tenant_id;
    lua.id = "audit";
    lua.name = "Audit";
    lua.version = "1.2.0";
    lua.kind = "lua";
    lua.manifest = Json{{"id", "audit"}, {"hooks", {"tool.after"}}, {"note", "ünïcode ✓"}};
    lua.source = "return { on = { [\"tool.after\"] = function(e) end } }\n";
    lua.config = Json{{"level", 2}};
    lua.created_at = now;
    lua.updated_at = now + 1;
    Plugin hook = lua;
    hook.id = "hook";
    hook.name = "Hook";
    hook.kind = "webhook";
    hook.source = "";
    hook.config = Json{{"url", "https://example.com/hook"}};
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(lua));
    KEEL_RETURN_IF_ERROR(tx.plugins().UpsertPlugin(hook));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({tenant_id, "audit", a.id, now}));
    KEEL_RETURN_IF_ERROR(tx.plugins().EnablePlugin({tenant_id, "hook", "*", now}));
    PluginDelivery d;
    d.id = NewId();
    d.tenant_id = tenant_id;
    d.plugin_id = "hook";
    d.agent_id = a.id;
    d.event_type = "run.completed@v1";
    d.created_at = d.next_attempt_at = now;
    KEEL_RETURN_IF_ERROR(tx.plugins().InsertDelivery(d));
    for (const char* type : {"message.created@v1", "run.started@v1", "run.completed@v1"}) {
      KEEL_RETURN_IF_ERROR(tx.events().Append(
          {tenant_id, type, a.id, s.id, r.id, Json{{"note", "ünïcode ✓"}, {"n", 1}}}));
    }
    return Status::Ok();
  });
}

class ArchiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("keel-archive-" + NewId());
    fs::create_directories(dir_);
    source_ = OpenTestStore(/*postgres=*/false, dir_);
    ASSERT_TRUE(source_->store);
    ASSERT_TRUE(Fill(*source_->store, "tenant-a").ok());
    ASSERT_TRUE(Fill(*source_->store, "tenant-b").ok());
    archive_ = (dir_ / "export.tar.zst").string();
    Status st = ExportArchive(*source_->store, "", archive_);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  void TearDown() override {
    source_.reset();
    fs::remove_all(dir_);
  }
  // The import target: a fresh PostgreSQL database when the tests have a server.
  std::unique_ptr<TestStore> NewTarget() { return OpenTestStore(PgAdminUrl() != nullptr, dir_); }
  std::string Path(const std::string& name) { return (dir_ / name).string(); }

  // Imports `path` into a new target, expects `code`, and that the target is still empty.
  void ExpectRefused(const std::string& path, Code code, const std::string& fragment) {
    auto target = NewTarget();
    ASSERT_TRUE(target->store);
    Status st = ImportArchive(*target->store, path);
    EXPECT_EQ(st.code(), code) << st.ToString();
    EXPECT_NE(st.message().find(fragment), std::string::npos) << st.message();
    EXPECT_TRUE(IsEmpty(*target->store));
  }

  fs::path dir_;
  std::unique_ptr<TestStore> source_;
  std::string archive_;
};

size_t EntryIndex(const Entries& entries, const std::string& name) {
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].first == name) return i;
  }
  ADD_FAILURE() << "no entry " << name;
  return 0;
}

TEST_F(ArchiveTest, ManifestComesFirstAndDescribesEveryTable) {
  Entries entries = ReadArchive(archive_);
  ASSERT_EQ(entries.size(), ExportTables().size() + 1);
  EXPECT_EQ(entries[0].first, "manifest.json");
  Json manifest = Json::parse(entries[0].second);
  EXPECT_EQ(manifest["format"], "keel-export");
  EXPECT_EQ(manifest["version"], kArchiveVersion);
  EXPECT_TRUE(manifest["tenant"].is_null());
  EXPECT_EQ(manifest["tables"]["tenants"]["rows"], 2);
  EXPECT_EQ(manifest["tables"]["api_tokens"]["rows"], 6);
  EXPECT_EQ(manifest["tables"]["messages"]["rows"], 4);
  EXPECT_EQ(manifest["tables"]["run_steps"]["rows"], 4);
  EXPECT_EQ(manifest["tables"]["events"]["rows"], 6);
  EXPECT_EQ(manifest["tables"]["plugins"]["rows"], 4);
  EXPECT_EQ(manifest["tables"]["agent_plugins"]["rows"], 4);
  EXPECT_FALSE(manifest["tables"].contains("plugin_deliveries"));  // not exported
  for (size_t i = 0; i < ExportTables().size(); ++i) {
    EXPECT_EQ(entries[i + 1].first, std::string(ExportTables()[i].name) + ".jsonl");
  }
  // Events by position; JSON-text columns as strings.
  std::istringstream events(entries.back().second);
  std::string line;
  int64_t last = 0;
  while (std::getline(events, line)) {
    Json row = Json::parse(line);
    EXPECT_GT(row["position"].get<int64_t>(), last);
    last = row["position"].get<int64_t>();
    EXPECT_TRUE(row["payload"].is_string());
  }
}

TEST_F(ArchiveTest, RoundTripAcrossBackendsIsByteIdentical) {
  auto target = NewTarget();
  ASSERT_TRUE(target->store);
  Status st = ImportArchive(*target->store, archive_);
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::string again = Path("again.tar.zst");
  st = ExportArchive(*target->store, "", again);
  ASSERT_TRUE(st.ok()) << st.ToString();

  Entries a = ReadArchive(archive_), b = ReadArchive(again);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 1; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_EQ(a[i].second, b[i].second) << a[i].first;
  }
  // The manifests differ only in created_at.
  Json ma = Json::parse(a[0].second), mb = Json::parse(b[0].second);
  ma.erase("created_at");
  mb.erase("created_at");
  EXPECT_EQ(ma, mb);

  // One tenant's export reads the same from both backends too.
  std::string one_a = Path("one-a.tar.zst"), one_b = Path("one-b.tar.zst");
  ASSERT_TRUE(ExportArchive(*source_->store, "tenant-b", one_a).ok());
  ASSERT_TRUE(ExportArchive(*target->store, "tenant-b", one_b).ok());
  a = ReadArchive(one_a);
  b = ReadArchive(one_b);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 1; i < a.size(); ++i) EXPECT_EQ(a[i].second, b[i].second) << a[i].first;

  // The log goes on after the imported events: the tenant's next position, its gapless
  // origin_seq.
  std::vector<Event> appended;
  st = target->store->WriteSync(
      [](Tx& tx) {
        return tx.events().Append({"tenant-a", "test@v1", "", "", "", {}});
      },
      &appended);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(appended.size(), 1u);
  EXPECT_EQ(appended[0].origin_seq, 4);
  EXPECT_EQ(appended[0].position, 4);

  // The plugins and their enablements came across; their deliveries did not.
  ASSERT_TRUE(target->store->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(Plugin audit, tx.plugins().GetPlugin("tenant-a", "audit"));
    EXPECT_EQ(audit.version, "1.2.0");
    EXPECT_EQ(audit.source, "return { on = { [\"tool.after\"] = function(e) end } }\n");
    EXPECT_EQ(audit.manifest["note"], "ünïcode ✓");
    EXPECT_EQ(audit.updated_at, audit.created_at + 1);
    KEEL_ASSIGN_OR_RETURN(auto enabled, tx.plugins().ListEnablements("tenant-b", "hook"));
    EXPECT_EQ(enabled.size(), 1u);
    KEEL_ASSIGN_OR_RETURN(auto deliveries,
                          tx.plugins().ListDeliveries("tenant-a", "hook", "", {"", 50}));
    EXPECT_TRUE(deliveries.items.empty());
    return Status::Ok();
  }).ok());
}

// Version 2 archives were written before the plugin tables (and before sessions had a
// description, a creator and instructions, and tenants their settings): they import, with no
// plugins, sessions described "", opened by "" and with no instructions of their own, and
// tenants allowed neither host execution nor unsandboxed stdio MCP servers. Nor did they carry the
// audit chain: their events are hashed as they are imported, into the very chains the source store
// had. Their events carry the store-wide origin_seq and no tenant_position: they are numbered per
// tenant. Their messages carry no seq: numbered per session in id order.
TEST_F(ArchiveTest, ImportsAVersion2ArchiveWithoutThePluginTables) {
  ASSERT_EQ(kArchiveVersion, 16);
  // The tables archives gained in versions 3 (plugins), 4 (schedules, memory, skills,
  // compactions, usage), 11 (channels) and 12 (users).
  const std::set<std::string> later = {"plugins",
                                       "agent_plugins",
                                       "schedules",
                                       "schedule_fires",
                                       "memories",
                                       "working_memories",
                                       "skills",
                                       "agent_skills",
                                       "compactions",
                                       "budgets",
                                       "model_usage",
                                       "usage_totals",
                                       "channels",
                                       "channel_conversations",
                                       "channel_deliveries",
                                       "users",
                                       "identities",
                                       "agent_members",
                                       "agent_access"};
  // Rebuilt on import (version 7) rather than empty.
  const std::set<std::string> rebuilt = {"audit_heads"};
  Entries entries = ReadArchive(archive_);
  Entries v2;
  for (const auto& e : entries) {
    const std::string table = e.first.substr(0, e.first.size() - 6);
    if (!later.count(table) && !rebuilt.count(table)) v2.push_back(e);
  }
  ASSERT_EQ(v2.size(), entries.size() - later.size() - rebuilt.size());
  Json manifest = Json::parse(v2[0].second);
  manifest["version"] = 2;
  for (const auto& name : later) manifest["tables"].erase(name);
  for (const auto& name : rebuilt) manifest["tables"].erase(name);
  // Columns added later, with the value an old archive's rows import with (null: any value,
  // recomputed on import).
  const std::map<std::string, std::map<std::string, Json>> added = {
      {"sessions", {{"description", ""}, {"created_by", ""}, {"instructions", ""}}},
      {"tenants", {{"allow_host_exec", 0}, {"allow_stdio_mcp", 0}}},
      {"events", {{"hash", nullptr}}},
      {"messages", {{"seq", nullptr}}},
      {"api_tokens", {{"parent_id", ""}, {"expires_at", nullptr}, {"user_id", ""}}}};
  int64_t store_wide_seq = 0;  // one origin wrote every event
  std::string v2_tokens;       // the tokens a version 2 archive could hold: no dashboard sign-in
  for (auto& e : v2) {
    std::string table = e.first.substr(0, e.first.size() - 6);
    if (!added.count(table)) continue;
    std::istringstream lines(e.second);
    std::string line, stripped;
    while (std::getline(lines, line)) {
      Json row = Json::parse(line);
      if (table == "api_tokens") {
        if (row["parent_id"] != "") continue;
        v2_tokens += line + "\n";
      }
      for (const auto& [column, value] : added.at(table)) {
        if (!value.is_null()) ASSERT_EQ(row[column], value);
        row.erase(column);
      }
      if (table == "events") {
        row.erase("tenant_position");
        row["origin_seq"] = ++store_wide_seq;
      }
      stripped += row.dump() + "\n";
    }
    ASSERT_FALSE(stripped.empty());
    e.second = stripped;
    manifest["tables"][table]["sha256"] = Sha256Hex(stripped);
    manifest["tables"][table]["rows"] = std::count(stripped.begin(), stripped.end(), '\n');
  }
  v2[0].second = manifest.dump(2) + "\n";
  std::string path = Path("v2.tar.zst");
  WriteArchive(path, v2);

  auto target = NewTarget();
  ASSERT_TRUE(target->store);
  Status st = ImportArchive(*target->store, path);
  ASSERT_TRUE(st.ok()) << st.ToString();
  // Everything else is there, byte for byte; the plugin tables are empty.
  std::string again = Path("v2-again.tar.zst");
  ASSERT_TRUE(ExportArchive(*target->store, "", again).ok());
  Entries out = ReadArchive(again);
  ASSERT_EQ(out.size(), entries.size());
  EXPECT_EQ(Json::parse(out[0].second)["version"], kArchiveVersion);
  for (size_t i = 1; i < out.size(); ++i) {
    EXPECT_EQ(out[i].first, entries[i].first);
    if (later.count(out[i].first.substr(0, out[i].first.size() - 6))) {
      EXPECT_EQ(out[i].second, "") << out[i].first;
    } else if (out[i].first == "api_tokens.jsonl") {
      EXPECT_EQ(out[i].second, v2_tokens);
    } else {
      EXPECT_EQ(out[i].second, entries[i].second) << out[i].first;
    }
  }

  // A version 2 archive has no plugin tables: one that does is refused, as is version 1.
  Entries mixed = entries;
  manifest = Json::parse(mixed[0].second);
  manifest["version"] = 2;
  mixed[0].second = manifest.dump();
  WriteArchive(Path("mixed.tar.zst"), mixed);
  ExpectRefused(Path("mixed.tar.zst"), Code::kInvalidArgument, "unknown table");
  Entries v1 = v2;
  manifest = Json::parse(v1[0].second);
  manifest["version"] = 1;
  v1[0].second = manifest.dump();
  WriteArchive(Path("v1.tar.zst"), v1);
  ExpectRefused(Path("v1.tar.zst"), Code::kInvalidArgument, "unsupported export version 1");
  // A version 3 archive must have them.
  Entries lacking = v2;
  manifest = Json::parse(lacking[0].second);
  manifest["version"] = 3;
  lacking[0].second = manifest.dump();
  WriteArchive(Path("lacking.tar.zst"), lacking);
  ExpectRefused(Path("lacking.tar.zst"), Code::kInvalidArgument, "lacks table plugins");
}

TEST_F(ArchiveTest, ExportsOneTenant) {
  std::string path = Path("one.tar.zst");
  Status st = ExportArchive(*source_->store, "tenant-b", path);
  ASSERT_TRUE(st.ok()) << st.ToString();
  Entries entries = ReadArchive(path);
  Json manifest = Json::parse(entries[0].second);
  EXPECT_EQ(manifest["tenant"]["id"], "tenant-b");
  EXPECT_EQ(manifest["tables"]["tenants"]["rows"], 1);
  EXPECT_EQ(manifest["tables"]["events"]["rows"], 3);
  for (size_t i = 1; i < entries.size(); ++i) {
    EXPECT_EQ(entries[i].second.find("tenant-a"), std::string::npos) << entries[i].first;
  }
  auto target = NewTarget();
  ASSERT_TRUE(target->store);
  st = ImportArchive(*target->store, path);
  EXPECT_TRUE(st.ok()) << st.ToString();

  EXPECT_EQ(ExportArchive(*source_->store, "no-such-tenant", Path("none.tar.zst")).code(),
            Code::kNotFound);
}

TEST_F(ArchiveTest, FailedExportLeavesNoFile) {
  std::string path = Path("no-such-dir/export.tar.zst");
  EXPECT_FALSE(ExportArchive(*source_->store, "", path).ok());
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".partial"));
}

TEST_F(ArchiveTest, RefusesANonEmptyStore) {
  auto target = NewTarget();
  ASSERT_TRUE(target->store);
  ASSERT_TRUE(Fill(*target->store, "tenant-z").ok());
  std::string before = Path("before.tar.zst"), after = Path("after.tar.zst");
  ASSERT_TRUE(ExportArchive(*target->store, "", before).ok());
  Status st = ImportArchive(*target->store, archive_);
  EXPECT_EQ(st.code(), Code::kConflict) << st.ToString();
  ASSERT_TRUE(ExportArchive(*target->store, "", after).ok());
  Entries a = ReadArchive(before), b = ReadArchive(after);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 1; i < a.size(); ++i) EXPECT_EQ(a[i].second, b[i].second) << a[i].first;
}

TEST_F(ArchiveTest, RefusesATamperedRow) {
  Entries entries = ReadArchive(archive_);
  std::string& agents = entries[EntryIndex(entries, "agents.jsonl")].second;
  size_t at = agents.find("helper");
  ASSERT_NE(at, std::string::npos);
  agents.replace(at, 6, "hacker");
  std::string path = Path("tampered.tar.zst");
  WriteArchive(path, entries);
  ExpectRefused(path, Code::kInvalidArgument, "sha256");
}

TEST_F(ArchiveTest, RefusesATruncatedArchive) {
  std::string bytes = ReadFile(archive_);
  std::string path = Path("truncated.tar.zst");
  std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  ExpectRefused(path, Code::kInvalidArgument, "truncated");
}

TEST_F(ArchiveTest, RefusesAWrongVersion) {
  Entries entries = ReadArchive(archive_);
  Json manifest = Json::parse(entries[0].second);
  manifest["version"] = kArchiveVersion + 1;
  entries[0].second = manifest.dump();
  std::string path = Path("next-version.tar.zst");
  WriteArchive(path, entries);
  ExpectRefused(path, Code::kInvalidArgument, "version " + std::to_string(kArchiveVersion + 1));
}

TEST_F(ArchiveTest, RefusesMissingExtraAndMalformedEntries) {
  Entries entries = ReadArchive(archive_);
  Entries missing(entries.begin(), entries.end() - 1);
  WriteArchive(Path("missing.tar.zst"), missing);
  ExpectRefused(Path("missing.tar.zst"), Code::kInvalidArgument, "missing entry events.jsonl");

  Entries extra = entries;
  extra.emplace_back("unknown_table.jsonl", "");
  WriteArchive(Path("extra.tar.zst"), extra);
  ExpectRefused(Path("extra.tar.zst"), Code::kInvalidArgument,
                "unexpected entry unknown_table.jsonl");

  // A malformed line with a manifest that matches it: the row check still refuses it.
  Entries malformed = entries;
  const size_t agents = EntryIndex(malformed, "agents.jsonl");
  malformed[agents].second += "{\"id\": 1}\n";
  Json manifest = Json::parse(malformed[0].second);
  manifest["tables"]["agents"]["rows"] = manifest["tables"]["agents"]["rows"].get<int>() + 1;
  manifest["tables"]["agents"]["sha256"] = Sha256Hex(malformed[agents].second);
  malformed[0].second = manifest.dump();
  WriteArchive(Path("malformed.tar.zst"), malformed);
  ExpectRefused(Path("malformed.tar.zst"), Code::kInvalidArgument, "agents.jsonl line 3");

  Entries miscounted = entries;
  manifest = Json::parse(miscounted[0].second);
  manifest["tables"]["runs"]["rows"] = 5;
  miscounted[0].second = manifest.dump();
  WriteArchive(Path("miscounted.tar.zst"), miscounted);
  ExpectRefused(Path("miscounted.tar.zst"), Code::kInvalidArgument, "runs.jsonl has 2 rows");
}

// Two messages of one session with one seq (or a seq below 1) are refused before anything is
// written, as any malformed row, not left to the store's unique index.
TEST_F(ArchiveTest, RefusesMessagesThatShareASeq) {
  Entries entries = ReadArchive(archive_);
  const size_t at = EntryIndex(entries, "messages.jsonl");
  auto rewrite = [&](const std::function<void(std::vector<Json>&)>& change,
                     const std::string& name) {
    Entries changed = entries;
    std::istringstream lines(changed[at].second);
    std::vector<Json> rows;
    for (std::string line; std::getline(lines, line);) rows.push_back(Json::parse(line));
    change(rows);
    std::string text;
    for (const auto& r : rows) text += r.dump() + "\n";
    changed[at].second = text;
    Json manifest = Json::parse(changed[0].second);
    manifest["tables"]["messages"]["sha256"] = Sha256Hex(text);
    changed[0].second = manifest.dump();
    WriteArchive(Path(name), changed);
    return Path(name);
  };
  std::string dup = rewrite([](std::vector<Json>& rows) {
    for (size_t i = 1; i < rows.size(); ++i) {
      if (rows[i]["session_id"] == rows[0]["session_id"]) rows[i]["seq"] = rows[0]["seq"];
    }
  }, "dup-seq.tar.zst");
  ExpectRefused(dup, Code::kInvalidArgument, "have seq");
  std::string zero = rewrite([](std::vector<Json>& rows) { rows[0]["seq"] = 0; },
                             "zero-seq.tar.zst");
  ExpectRefused(zero, Code::kInvalidArgument, "field 'seq' must be at least 1");
}

}  // namespace
}  // namespace keel::store
