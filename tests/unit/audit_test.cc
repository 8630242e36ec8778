// The audit chain (store/audit.h): hashing, sealing and verification as pure functions, and a
// SQLite store that seals what it appends, hashes a log from before the chain when it opens,
// and whose tampered rows verification names.

#include "keel/store/audit.h"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <filesystem>

#include "keel/common/ids.h"
#include "keel/store/store.h"

namespace keel::store {
namespace {

const std::string kKek = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

// Rows shaped like the archive's (ExportTables): events with their hash, heads signed.
struct Log {
  std::vector<Json> events;
  std::vector<Json> heads;
};

Log MakeLog(const std::string& key, int n, const std::string& tenant = "t1",
            const std::string& origin = "node-a") {
  Log log;
  ChainSealer sealer(key);
  auto none = [](const std::string&, const std::string&) {
    return Result<std::optional<ChainHead>>(std::optional<ChainHead>());
  };
  std::vector<Event> unit;
  for (int i = 1; i <= n; ++i) {
    Event e;
    e.position = i;
    e.id = "ev" + std::to_string(i);
    e.tenant_id = tenant;
    e.type = "test.happened@v1";
    e.origin = origin;
    e.origin_seq = i;
    e.payload = Json{{"i", i}};
    e.occurred_at = 1000 + i;
    const std::string payload = DumpJson(e.payload);
    auto hash = sealer.Next(ChainedOf(e, payload), none);
    EXPECT_TRUE(hash.ok());
    sealer.Appended(ChainedOf(e, payload), *hash);
    log.events.push_back({{"position", e.position}, {"id", e.id}, {"tenant_id", tenant},
                          {"type", e.type}, {"origin", origin}, {"origin_seq", e.origin_seq},
                          {"agent_id", ""}, {"session_id", ""}, {"run_id", ""},
                          {"payload", payload}, {"occurred_at", e.occurred_at},
                          {"hash", *hash}});
    unit.push_back(e);
  }
  sealer.UnitDone(unit);
  for (const auto& h : sealer.Heads()) {
    log.heads.push_back({{"tenant_id", h.tenant_id}, {"origin", h.origin},
                         {"last_id", h.last_id}, {"last_seq", h.last_seq}, {"hash", h.hash},
                         {"anchor", h.anchor}, {"mac", h.mac}});
  }
  return log;
}

std::vector<ChainReport> Verify(const std::string& key, const Log& log) {
  ChainVerifier v(key);
  for (const auto& e : log.events) v.AddEvent(e);
  for (const auto& h : log.heads) v.AddHead(h);
  return v.Finish();
}

std::string Key() { return *AuditKeyFromKek(kKek); }

TEST(AuditChain, KeyIsDerivedFromTheKekAndNotTheKekItself) {
  auto key = AuditKeyFromKek(kKek);
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(key->size(), 64u);
  EXPECT_EQ(*key, *AuditKeyFromKek(kKek));
  EXPECT_EQ(*AuditKeyFromKek(""), "");
  EXPECT_FALSE(AuditKeyFromKek("not base64!").ok());
}

TEST(AuditChain, HashCoversEveryFieldAndThePredecessor) {
  ChainedFields f{"id", "t", "x@v1", "o", "a", "s", "r", "{}", 5};
  const std::string h = EventHash(f, "");
  EXPECT_EQ(h, EventHash(f, ""));
  EXPECT_NE(h, EventHash(f, "prev"));
  for (int i = 0; i < 9; ++i) {
    ChainedFields g = f;
    switch (i) {
      case 0: g.id = "id2"; break;
      case 1: g.tenant_id = "t2"; break;
      case 2: g.type = "y@v1"; break;
      case 3: g.origin = "o2"; break;
      case 4: g.agent_id = "a2"; break;
      case 5: g.session_id = "s2"; break;
      case 6: g.run_id = "r2"; break;
      case 7: g.payload = "{\"a\":1}"; break;
      case 8: g.occurred_at = 6; break;
    }
    EXPECT_NE(h, EventHash(g, "")) << "field " << i;
  }
  // Lengths prefix each field: moving a character between two fields changes the hash.
  ChainedFields shifted = f;
  shifted.agent_id = "as";
  shifted.session_id = "";
  EXPECT_NE(EventHash(shifted, ""), EventHash(ChainedFields{"id", "t", "x@v1", "o", "a", "ss", "r",
                                                            "{}", 5}, ""));
}

TEST(AuditChain, AnIntactSignedChainVerifies) {
  auto reports = Verify(Key(), MakeLog(Key(), 5));
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].status, "verified");
  EXPECT_EQ(reports[0].events, 5);
  EXPECT_EQ(reports[0].anchor, "");
}

TEST(AuditChain, AChangedEventIsNamed) {
  Log log = MakeLog(Key(), 5);
  log.events[2]["payload"] = "{\"i\":99}";
  auto reports = Verify(Key(), log);
  EXPECT_EQ(reports[0].status, "tampered");
  EXPECT_EQ(reports[0].event_id, "ev3");
  EXPECT_NE(reports[0].problem.find("ev3"), std::string::npos);
}

TEST(AuditChain, ARemovedEventIsFoundAtTheEventAfterIt) {
  Log log = MakeLog(Key(), 5);
  log.events.erase(log.events.begin() + 1);
  auto reports = Verify(Key(), log);
  EXPECT_EQ(reports[0].status, "tampered");
  EXPECT_EQ(reports[0].event_id, "ev3");
}

TEST(AuditChain, ARemovedLastEventIsNamedByTheHead) {
  Log log = MakeLog(Key(), 5);
  log.events.pop_back();
  auto reports = Verify(Key(), log);
  EXPECT_EQ(reports[0].status, "tampered");
  EXPECT_EQ(reports[0].event_id, "ev5");
}

TEST(AuditChain, SwappedEventsAreNamed) {
  Log log = MakeLog(Key(), 5);
  // Their contents exchanged between two positions: the log reads in another order.
  std::swap(log.events[1], log.events[2]);
  std::swap(log.events[1]["position"], log.events[2]["position"]);
  auto reports = Verify(Key(), log);
  EXPECT_EQ(reports[0].status, "tampered");
  EXPECT_EQ(reports[0].event_id, "ev3");
}

TEST(AuditChain, AChainRecomputedWithoutTheKeyFailsItsSignature) {
  Log log = MakeLog(Key(), 5);
  Log forged = MakeLog("", 5);  // the same events, hashed by someone without the key
  forged.events[2]["payload"] = "{\"i\":99}";
  // Rehash from the changed event on, as anyone can: SHA-256 needs no key.
  std::string prev = forged.events[1]["hash"];
  for (size_t i = 2; i < forged.events.size(); ++i) {
    Json& e = forged.events[i];
    const std::string payload = e["payload"];
    ChainedFields f{e["id"].get_ref<const std::string&>(),
                    e["tenant_id"].get_ref<const std::string&>(),
                    e["type"].get_ref<const std::string&>(),
                    e["origin"].get_ref<const std::string&>(),
                    "", "", "", payload, e["occurred_at"].get<int64_t>()};
    e["hash"] = EventHash(f, prev);
    prev = e["hash"];
  }
  forged.heads = log.heads;
  forged.heads[0]["hash"] = prev;  // the signature cannot follow
  auto reports = Verify(Key(), forged);
  EXPECT_EQ(reports[0].status, "tampered");
  EXPECT_NE(reports[0].problem.find("signature"), std::string::npos);
  // Without the key, the same forgery cannot be told apart: verification says so.
  EXPECT_EQ(Verify("", forged)[0].status, "unchecked");
}

TEST(AuditChain, HeadsWrittenWithoutAKeyAreUnsigned) {
  EXPECT_EQ(Verify(Key(), MakeLog("", 3))[0].status, "unsigned");
  EXPECT_EQ(Verify("", MakeLog("", 3))[0].status, "unsigned");
}

TEST(AuditChain, AChainWithoutItsHeadOrEventsWithoutTheirChainAreTampered) {
  Log log = MakeLog(Key(), 3);
  log.heads.clear();
  EXPECT_EQ(Verify(Key(), log)[0].status, "tampered");
  Log gone = MakeLog(Key(), 3);
  gone.events.clear();
  auto reports = Verify(Key(), gone);
  EXPECT_EQ(reports[0].status, "tampered");
  EXPECT_EQ(reports[0].event_id, "ev3");
}

TEST(AuditChain, ASealerExtendsAnUnverifiableHeadFromAnAnchor) {
  ChainSealer sealer(Key());
  ChainHead stored{"t1", "node-a", "ev9", 9, "abc", "", "forged"};
  auto load = [&](const std::string&, const std::string&) {
    return Result<std::optional<ChainHead>>(std::optional<ChainHead>(stored));
  };
  Event e;
  e.id = "ev10";
  e.tenant_id = "t1";
  e.origin = "node-a";
  e.origin_seq = 10;
  auto hash = sealer.Next(ChainedOf(e, "{}"), load);
  ASSERT_TRUE(hash.ok());
  EXPECT_EQ(*hash, EventHash(ChainedOf(e, "{}"), "abc"));
  sealer.Appended(ChainedOf(e, "{}"), *hash);
  sealer.UnitDone({e});
  auto heads = sealer.Heads();
  ASSERT_EQ(heads.size(), 1u);
  EXPECT_EQ(heads[0].anchor, "ev9");
  EXPECT_EQ(heads[0].last_seq, 10);
  EXPECT_EQ(heads[0].mac, HeadMac(Key(), heads[0]));
}

TEST(AuditChain, AFailedUnitMovesNoHead) {
  ChainSealer sealer(Key());
  auto none = [](const std::string&, const std::string&) {
    return Result<std::optional<ChainHead>>(std::optional<ChainHead>());
  };
  Event e;
  e.id = "ev1";
  e.tenant_id = "t1";
  e.origin = "o";
  auto hash = sealer.Next(ChainedOf(e, "{}"), none);
  sealer.Appended(ChainedOf(e, "{}"), *hash);
  sealer.UnitFailed();
  EXPECT_TRUE(sealer.Heads().empty());
}

// ---- a SQLite store

class AuditStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("keel-audit-" + NewId());
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "keel.db").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Store> Open(const std::string& key) {
    StoreOptions options;
    options.origin = "node-a";
    auto s = OpenStore("sqlite://" + path_, options, key);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return std::move(s).value();
  }
  void Sql(const std::string& sql) {
    sqlite3* db = nullptr;
    ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
    char* err = nullptr;
    EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err), SQLITE_OK) << err;
    sqlite3_free(err);
    sqlite3_close(db);
  }
  std::vector<ChainReport> VerifyStore(Store& s, const std::string& key) {
    std::vector<ChainReport> out;
    EXPECT_TRUE(s.Read([&](Tx& tx) -> Status {
                   KEEL_ASSIGN_OR_RETURN(out, VerifyTenantChains(tx, key, "t1"));
                   return Status::Ok();
                 }).ok());
    return out;
  }
  // `units` units of `per_unit` events each, some in one batch.
  void Append(Store& s, int units, int per_unit) {
    // The tenant exists after the first call.
    (void)s.WriteSync([](Tx& tx) { return tx.tenants().InsertTenant(Tenant{"t1", "one", 1}); });
    for (int u = 0; u < units; ++u) {
      ASSERT_TRUE(s.WriteSync([&](Tx& tx) -> Status {
                     for (int i = 0; i < per_unit; ++i) {
                       KEEL_RETURN_IF_ERROR(tx.events().Append(
                           NewEvent{"t1", "test.happened@v1", "", "", "", Json{{"i", i}}}));
                     }
                     return Status::Ok();
                   }).ok());
    }
  }

  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(AuditStoreTest, AppendedEventsAreSealedAndVerify) {
  auto s = Open(Key());
  Append(*s, 3, 2);
  // A failed unit leaves no trace in the chain.
  Status failed = s->WriteSync([](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.events().Append(NewEvent{"t1", "test.lost@v1"}));
    return Conflict("rolled back");
  });
  EXPECT_FALSE(failed.ok());
  Append(*s, 1, 1);
  auto reports = VerifyStore(*s, Key());
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_EQ(reports[0].status, "verified") << reports[0].problem;
  EXPECT_EQ(reports[0].events, 7);
  s->Close();
}

TEST_F(AuditStoreTest, AChangedRowIsNamed) {
  auto s = Open(Key());
  Append(*s, 4, 1);
  Sql("UPDATE events SET payload='{\"i\":7}' WHERE origin_seq=3");
  auto reports = VerifyStore(*s, Key());
  EXPECT_EQ(reports[0].status, "tampered");
  EXPECT_EQ(reports[0].origin_seq, 3);
  s->Close();
}

TEST_F(AuditStoreTest, ALogFromBeforeTheChainIsHashedWhenOpened) {
  {
    auto s = Open(Key());
    Append(*s, 3, 2);
    s->Close();
  }
  // As a Keel from before the chain left it: no hashes, no heads.
  Sql("UPDATE events SET hash=''; DELETE FROM audit_heads;");
  auto s = Open(Key());
  auto reports = VerifyStore(*s, Key());
  EXPECT_EQ(reports[0].status, "verified") << reports[0].problem;
  EXPECT_EQ(reports[0].events, 6);
  Append(*s, 1, 1);
  EXPECT_EQ(VerifyStore(*s, Key())[0].status, "verified");
  s->Close();
}

TEST_F(AuditStoreTest, AStoreWithoutAKeyWritesUnsignedHeadsThatAKeyHolderAnchors) {
  {
    auto s = Open("");
    Append(*s, 2, 1);
    EXPECT_EQ(VerifyStore(*s, Key())[0].status, "unsigned");
    s->Close();
  }
  auto s = Open(Key());
  Append(*s, 1, 1);
  auto reports = VerifyStore(*s, Key());
  EXPECT_EQ(reports[0].status, "verified");
  EXPECT_FALSE(reports[0].anchor.empty()) << "the events before the key are not vouched for";
  s->Close();
}

TEST_F(AuditStoreTest, ARemovedHeadIsCarriedOnFromAnAnchor) {
  auto s = Open(Key());
  Append(*s, 2, 1);
  s->Close();
  Sql("DELETE FROM audit_heads");
  auto again = Open(Key());
  EXPECT_EQ(VerifyStore(*again, Key())[0].status, "tampered");
  Append(*again, 1, 1);
  auto reports = VerifyStore(*again, Key());
  EXPECT_EQ(reports[0].status, "verified") << reports[0].problem;
  EXPECT_FALSE(reports[0].anchor.empty());
  again->Close();
}

}  // namespace
}  // namespace keel::store
