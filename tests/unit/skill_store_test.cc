// SkillStore conformance: every case runs against each backend (`SkillStore/SkillStoreTest.<Case>/
// sqlite` and `.../postgres`; the PostgreSQL cases skip without KEEL_TEST_PG_ADMIN_URL, see
// store_conformance_test.cc).

#include "keel/store/skill_store.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "keel/common/ids.h"
#include "keel/skills/skills.h"
#include "keel/store/store.h"
#include "pg_test_database.h"

namespace keel::store {
namespace {

enum class Backend { kSqlite, kPostgres };
std::string BackendName(Backend b) { return b == Backend::kSqlite ? "sqlite" : "postgres"; }

class SkillStoreTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    if (GetParam() == Backend::kPostgres && !PgAdminUrl()) GTEST_SKIP() << kPgSkip;
    std::string url;
    if (GetParam() == Backend::kPostgres) {
      Status st = pg_.Create();
      ASSERT_TRUE(st.ok()) << st.ToString();
      url = pg_.url();
    } else {
      dir_ = std::filesystem::temp_directory_path() / ("keel-skills-" + NewId());
      std::filesystem::create_directories(dir_);
      url = "sqlite://" + (dir_ / "keel.db").string();
    }
    StoreOptions o;
    o.origin = "node-a";
    auto opened = OpenStore(url, o);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    store_ = std::move(opened).value();
    tenant_ = MakeTenant();
  }
  void TearDown() override {
    store_.reset();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  std::string MakeTenant() {
    Tenant t{NewId(), "t", NowMillis()};
    Status st = store_->WriteSync([&](Tx& tx) { return tx.tenants().InsertTenant(t); });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return t.id;
  }

  // A skill as the API would store it.
  Skill NewSkill(const std::string& tenant, const std::string& name, const std::string& body,
                 Millis at = NowMillis()) {
    Json files = {
        {"SKILL.md", "---\nname: " + name + "\ndescription: does " + name + "\n---\n" + body},
        {"scripts/run.sh", "echo " + name + "\n"},
        {"logo.bin", {{"base64", "AAEC/w=="}}}};
    auto skill = skills::SkillOf(files);
    EXPECT_TRUE(skill.ok()) << skill.status().ToString();
    skill->tenant_id = tenant;
    skill->created_at = skill->updated_at = at;
    return *skill;
  }

  Status Write(const std::function<Status(Tx&)>& fn) { return store_->WriteSync(fn); }

  template <typename T, typename Fn>
  T Read(Fn fn) {
    T out{};
    Status st = store_->Read([&](Tx& tx) -> Status {
      auto r = fn(tx);
      if (!r.ok()) return r.status();
      out = std::move(r).value();
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  }

  std::vector<std::string> Names(const std::vector<Skill>& skills) {
    std::vector<std::string> out;
    for (const auto& s : skills) out.push_back(s.name);
    return out;
  }

  std::filesystem::path dir_;
  PgTestDatabase pg_;
  std::unique_ptr<Store> store_;
  std::string tenant_;
};

INSTANTIATE_TEST_SUITE_P(SkillStore, SkillStoreTest,
                         ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return BackendName(info.param);
                         });

TEST_P(SkillStoreTest, KeepsFilesWholeAndListsWithoutThem) {
  Skill pdf = NewSkill(tenant_, "pdf", "Fill forms.\n");
  Skill csv = NewSkill(tenant_, "csv", "Read tables.\n");
  ASSERT_TRUE(Write([&](Tx& tx) { return tx.skills().UpsertSkill(pdf); }).ok());
  ASSERT_TRUE(Write([&](Tx& tx) { return tx.skills().UpsertSkill(csv); }).ok());

  Skill got = Read<Skill>([&](Tx& tx) { return tx.skills().GetSkill(tenant_, "pdf", true); });
  EXPECT_EQ(got.name, "pdf");
  EXPECT_EQ(got.description, "does pdf");
  EXPECT_EQ(got.hash, pdf.hash);
  EXPECT_EQ(got.bytes, pdf.bytes);
  EXPECT_EQ(got.manifest, pdf.manifest);
  EXPECT_EQ(got.files, pdf.files);
  EXPECT_EQ(got.created_at, pdf.created_at);
  auto logo = skills::FileBytes(got, "logo.bin");
  ASSERT_TRUE(logo.ok());
  EXPECT_EQ(*logo, std::string("\x00\x01\x02\xff", 4));

  Skill meta = Read<Skill>([&](Tx& tx) { return tx.skills().GetSkill(tenant_, "pdf", false); });
  EXPECT_TRUE(meta.files.is_null());
  EXPECT_EQ(meta.manifest, pdf.manifest);

  auto all = Read<std::vector<Skill>>([&](Tx& tx) { return tx.skills().ListSkills(tenant_); });
  EXPECT_EQ(Names(all), (std::vector<std::string>{"csv", "pdf"}));
  for (const auto& s : all) EXPECT_TRUE(s.files.is_null()) << s.name;
}

TEST_P(SkillStoreTest, RegisteringAgainReplacesAndKeepsCreationTimeAndAssignments) {
  Skill first = NewSkill(tenant_, "pdf", "v1\n", 1000);
  ASSERT_TRUE(Write([&](Tx& tx) { return tx.skills().UpsertSkill(first); }).ok());
  ASSERT_TRUE(Write([&](Tx& tx) {
                return tx.skills().AssignSkill({tenant_, "agent-1", "pdf", 1000});
              }).ok());
  Skill second = NewSkill(tenant_, "pdf", "v2\n", 2000);
  second.created_at = 2000;
  ASSERT_TRUE(Write([&](Tx& tx) { return tx.skills().UpsertSkill(second); }).ok());

  Skill got = Read<Skill>([&](Tx& tx) { return tx.skills().GetSkill(tenant_, "pdf", true); });
  EXPECT_EQ(got.hash, second.hash);
  EXPECT_NE(got.hash, first.hash);
  EXPECT_EQ(got.created_at, 1000);
  EXPECT_EQ(got.updated_at, 2000);
  EXPECT_EQ(got.files["SKILL.md"], second.files["SKILL.md"]);
  auto assigned = Read<std::vector<SkillAssignment>>(
      [&](Tx& tx) { return tx.skills().ListSkillAssignments(tenant_, "pdf"); });
  ASSERT_EQ(assigned.size(), 1u);
  EXPECT_EQ(assigned[0].agent_id, "agent-1");
}

TEST_P(SkillStoreTest, AssignmentsAreIdempotentNeedTheSkillAndGoWithIt) {
  ASSERT_TRUE(
      Write([&](Tx& tx) { return tx.skills().UpsertSkill(NewSkill(tenant_, "pdf", "")); }).ok());
  ASSERT_TRUE(
      Write([&](Tx& tx) { return tx.skills().UpsertSkill(NewSkill(tenant_, "csv", "")); }).ok());
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(Write([&](Tx& tx) {
                  return tx.skills().AssignSkill({tenant_, "a1", "pdf", 1000 + i});
                }).ok());
  }
  ASSERT_TRUE(Write([&](Tx& tx) {
                return tx.skills().AssignSkill({tenant_, "a1", "csv", 1});
              }).ok());
  ASSERT_TRUE(Write([&](Tx& tx) {
                return tx.skills().AssignSkill({tenant_, "a2", "pdf", 1});
              }).ok());

  Status missing = Write([&](Tx& tx) {
    return tx.skills().AssignSkill({tenant_, "a1", "nope", 1});
  });
  EXPECT_EQ(missing.code(), Code::kNotFound) << missing.ToString();

  auto of_pdf = Read<std::vector<SkillAssignment>>(
      [&](Tx& tx) { return tx.skills().ListSkillAssignments(tenant_, "pdf"); });
  ASSERT_EQ(of_pdf.size(), 2u);
  EXPECT_EQ(of_pdf[0].agent_id, "a1");
  EXPECT_EQ(of_pdf[0].created_at, 1000);  // the first assignment's time
  EXPECT_EQ(of_pdf[1].agent_id, "a2");

  auto for_a1 = Read<std::vector<Skill>>(
      [&](Tx& tx) { return tx.skills().SkillsForAgent(tenant_, "a1", false); });
  EXPECT_EQ(Names(for_a1), (std::vector<std::string>{"csv", "pdf"}));
  EXPECT_TRUE(for_a1[0].files.is_null());
  auto whole = Read<std::vector<Skill>>(
      [&](Tx& tx) { return tx.skills().SkillsForAgent(tenant_, "a1", true); });
  ASSERT_EQ(whole.size(), 2u);
  EXPECT_TRUE(whole[0].files.contains("SKILL.md"));

  ASSERT_TRUE(Write([&](Tx& tx) { return tx.skills().UnassignSkill(tenant_, "a1", "csv"); }).ok());
  Status again = Write([&](Tx& tx) { return tx.skills().UnassignSkill(tenant_, "a1", "csv"); });
  EXPECT_EQ(again.code(), Code::kNotFound);

  ASSERT_TRUE(Write([&](Tx& tx) { return tx.skills().DeleteSkill(tenant_, "pdf"); }).ok());
  Status gone = Write([&](Tx& tx) { return tx.skills().DeleteSkill(tenant_, "pdf"); });
  EXPECT_EQ(gone.code(), Code::kNotFound);
  auto left = Read<std::vector<Skill>>(
      [&](Tx& tx) { return tx.skills().SkillsForAgent(tenant_, "a1", false); });
  EXPECT_TRUE(left.empty());
  auto none = Read<std::vector<SkillAssignment>>(
      [&](Tx& tx) { return tx.skills().ListSkillAssignments(tenant_, "pdf"); });
  EXPECT_TRUE(none.empty());
}

TEST_P(SkillStoreTest, TenantsDoNotSeeEachOthersSkills) {
  std::string other = MakeTenant();
  ASSERT_TRUE(
      Write([&](Tx& tx) { return tx.skills().UpsertSkill(NewSkill(tenant_, "pdf", "")); }).ok());
  Status st = store_->Read([&](Tx& tx) -> Status {
    EXPECT_EQ(tx.skills().GetSkill(other, "pdf", false).status().code(), Code::kNotFound);
    auto list = tx.skills().ListSkills(other);
    EXPECT_TRUE(list.ok() && list->empty());
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok());
  Status assign = Write([&](Tx& tx) { return tx.skills().AssignSkill({other, "a1", "pdf", 1}); });
  EXPECT_EQ(assign.code(), Code::kNotFound);
  Status del = Write([&](Tx& tx) { return tx.skills().DeleteSkill(other, "pdf"); });
  EXPECT_EQ(del.code(), Code::kNotFound);
}

}  // namespace
}  // namespace keel::store
