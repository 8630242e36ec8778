// keel store rebuild --from-events (store/rebuild.h) on the edges the integration test
// (tests/integration/test_rebuild.py) cannot reach through the API: a log from before events
// carried row images, images that are not what a store writes, and a unit that writes rows
// without an event to carry them.

#include "keel/store/rebuild.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/store/row_images.h"
#include "keel/store/schedule_store.h"
#include "keel/store/store.h"

namespace keel::store {
namespace {

namespace fs = std::filesystem;

class RebuildTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("keel-rebuild-" + NewId());
    fs::create_directories(dir_);
    from_ = Open("from.db");
  }
  void TearDown() override {
    if (from_) from_->Close();
    fs::remove_all(dir_);
  }
  std::unique_ptr<Store> Open(const std::string& name) {
    StoreOptions o;
    o.origin = "test-origin";
    auto s = OpenStore("sqlite://" + (dir_ / name).string(), o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }
  static Tenant NewTenant() { return Tenant{NewId(), "t-" + NewId(), NowMillis()}; }
  // A tenant created as every Keel writes one now: its row rides tenant.created@v1.
  Status CreateTenant(const Tenant& t) {
    return from_->WriteSync([&](Tx& tx) -> Status {
      KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant(t));
      tx.Carry("tenants", RowImage(t));
      return tx.events().Append({t.id, "tenant.created@v1", "", "", "", {{"tenant_id", t.id}}});
    });
  }
  // An agent.created@v1 carrying `image` as an agents row.
  Status AppendAgentImage(const std::string& tenant_id, std::string image) {
    return from_->WriteSync([&](Tx& tx) -> Status {
      tx.Carry("agents", std::move(image));
      return tx.events().Append({tenant_id, "agent.created@v1", "", "", "", Json::object()});
    });
  }
  Result<RebuildReport> Rebuild() {
    auto into = Open("into-" + NewId() + ".db");
    auto report = RebuildFromEvents(*from_, *into, "");
    into->Close();
    return report;
  }

  fs::path dir_;
  std::unique_ptr<Store> from_;
};

TEST_F(RebuildTest, ALogFromBeforeRowImagesIsRefusedNotRebuiltInPart) {
  // As Keel wrote a tenant before events carried rows: the tenant and its event, no image.
  Tenant old = NewTenant();
  ASSERT_TRUE(from_->WriteSync([&](Tx& tx) -> Status {
                     KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant(old));
                     return tx.events().Append(
                         {old.id, "tenant.created@v1", "", "", "", {{"tenant_id", old.id}}});
                   })
                  .ok());
  // Later, with images: a whole tenants row for it (a settings change) and a new tenant.
  ASSERT_TRUE(from_->WriteSync([&](Tx& tx) -> Status {
                     old.allow_host_exec = true;
                     KEEL_RETURN_IF_ERROR(tx.tenants().UpdateTenantSettings(old));
                     tx.Carry("tenants", RowImage(old));
                     return tx.events().Append(
                         {old.id, "tenant.settings_changed@v1", "", "", "", Json::object()});
                   })
                  .ok());
  ASSERT_TRUE(CreateTenant(NewTenant()).ok());
  auto report = Rebuild();
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), Code::kInvalidArgument);
  EXPECT_NE(report.status().message().find("tenant " + old.id + " was created before"),
            std::string::npos)
      << report.status().message();
}

TEST_F(RebuildTest, ImagesThatNoStoreWritesAreRefusedNamingTheEvent) {
  Tenant t = NewTenant();
  ASSERT_TRUE(CreateTenant(t).ok());
  // An agents image lacking its columns: not whole after the last event.
  ASSERT_TRUE(AppendAgentImage(t.id, ColumnsImage({{"id", NewId()}, {"name", "half"}})).ok());
  auto report = Rebuild();
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("does not hold the whole agents row"),
            std::string::npos)
      << report.status().message();
}

// A row whose last image was written before its table gained a column (here a schedule from
// before schedules.user_id and channel_id) rebuilds with the value the migration gave existing
// rows.
TEST_F(RebuildTest, AnImageFromBeforeAColumnWasAddedRebuildsWithTheMigrationsValue) {
  Tenant t = NewTenant();
  ASSERT_TRUE(CreateTenant(t).ok());
  Schedule s;
  s.id = NewId();
  s.tenant_id = t.id;
  s.agent_id = NewId();
  s.name = "daily";
  s.cron = "0 9 * * *";
  s.prompt = "p";
  s.next_fire_at = 5000;
  s.created_by = "tok";
  s.caller_role = "user";
  s.created_at = s.updated_at = 1000;
  Json image = Json::parse(RowImage(s));
  ASSERT_TRUE(image.contains("user_id"));
  ASSERT_TRUE(image.contains("channel_id"));
  image.erase("user_id");
  image.erase("channel_id");
  ASSERT_TRUE(from_
                  ->WriteSync([&](Tx& tx) -> Status {
                    tx.Carry("schedules", ColumnsImage(image));
                    return tx.events().Append(
                        {t.id, "schedule.created@v1", s.agent_id, "", "", {{"schedule_id", s.id}}});
                  })
                  .ok());
  auto into = Open("into.db");
  auto report = RebuildFromEvents(*from_, *into, "");
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  Schedule got;
  ASSERT_TRUE(into->Read([&](Tx& tx) -> Status {
                    KEEL_ASSIGN_OR_RETURN(got, tx.schedules().GetSchedule(t.id, s.id));
                    return Status::Ok();
                  })
                  .ok());
  into->Close();
  EXPECT_EQ(got.user_id, "");
  EXPECT_EQ(got.channel_id, "");
  EXPECT_EQ(got.cron, "0 9 * * *");
  EXPECT_EQ(got.caller_role, "user");
}

TEST_F(RebuildTest, AnImageWithoutItsKeyIsRefused) {
  Tenant t = NewTenant();
  ASSERT_TRUE(CreateTenant(t).ok());
  ASSERT_TRUE(AppendAgentImage(t.id, ColumnsImage({{"name", "no id"}})).ok());
  auto report = Rebuild();
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("agents image lacks its key"), std::string::npos)
      << report.status().message();
}

TEST_F(RebuildTest, AUnitThatCarriesRowsAndAppendsNoEventFailsAndWritesNothing) {
  Tenant t = NewTenant();
  Status st = from_->WriteSync([&](Tx& tx) -> Status {
    KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant(t));
    tx.Carry("tenants", RowImage(t));
    return Status::Ok();
  });
  EXPECT_EQ(st.code(), Code::kInternal);
  EXPECT_NE(st.message().find("appended no event"), std::string::npos) << st.message();
  Status read = from_->Read([&](Tx& tx) { return tx.tenants().GetTenant(t.id).status(); });
  EXPECT_EQ(read.code(), Code::kNotFound);
  // The writer goes on: the next unit is not charged with the failed one's images.
  ASSERT_TRUE(CreateTenant(NewTenant()).ok());
  auto report = Rebuild();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->rows["tenants"], 1);
}

}  // namespace
}  // namespace keel::store
