// IntrospectionStore conformance: every case runs against each backend (`IntrospectionStore/
// IntrospectionStoreTest.<Case>/sqlite` and `.../postgres`; the PostgreSQL cases skip without
// KEEL_TEST_PG_ADMIN_URL, see store_conformance_test.cc).

#include "keel/store/introspection_store.h"

#include <gtest/gtest.h>

#include "keel/common/ids.h"
#include "session_store_fixture.h"

namespace keel::store {
namespace {

class IntrospectionStoreTest : public test::SessionStoreTest {};

KEEL_BACKENDS(IntrospectionStore, IntrospectionStoreTest);

TEST_P(IntrospectionStoreTest, TheDescriptionIsPartOfTheSession) {
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) {
                    return tx.introspection().SetSessionDescription(tenant_, session_,
                                                                    "About: trips", 42);
                  })
                  .ok());
  Status missing = store_->WriteSync(
      [&](Tx& tx) { return tx.introspection().SetSessionDescription(tenant_, NewId(), "x", 42); });
  EXPECT_EQ(missing.code(), Code::kNotFound);
  Status st = store_->Read([&](Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto s, tx.sessions().GetSession(tenant_, session_));
    EXPECT_EQ(s.description, "About: trips");
    EXPECT_EQ(s.updated_at, 42);
    return Status::Ok();
  });
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_P(IntrospectionStoreTest, TurnsAreCountedSinceTheLastIntrospection) {
  auto turns = [&] {
    int64_t n = -1;
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(n, tx.introspection().TurnsSinceIntrospection(tenant_, session_));
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return n;
  };
  EXPECT_EQ(turns(), 0);
  AddMessage("user", "a");
  AddMessage("assistant", "b");
  AddMessage("user", "c");
  EXPECT_EQ(turns(), 2);
  AddMessage("introspection", "{}");
  EXPECT_EQ(turns(), 0);
  AddMessage("user", "d");
  AddMessage("call", "{}");
  EXPECT_EQ(turns(), 1);
}

TEST_P(IntrospectionStoreTest, DueIntrospectionsAreMovedClearedAndFoundAcrossTenants) {
  std::string other_session = NewId();
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) -> Status {
                    return tx.sessions().InsertSession(
                        Session{other_session, tenant_, agent_, "idle", "s", 1, 1, ""});
                  })
                  .ok());
  auto put = [&](const std::string& session, Millis at) {
    Status st = store_->WriteSync([&](Tx& tx) {
      return tx.introspection().PutIntrospectionDue({tenant_, session, agent_, at});
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
  };
  auto due = [&](Millis now) {
    std::vector<std::string> out;
    Status st = store_->Read([&](Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto got, tx.introspection().DueIntrospections(now, 10));
      for (const auto& d : got) out.push_back(d.session_id + "@" + std::to_string(d.due_at));
      return Status::Ok();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return out;
  };
  using V = std::vector<std::string>;
  put(session_, 100);
  put(other_session, 50);
  put(session_, 200);  // moved by a later turn
  EXPECT_EQ(due(150), V{other_session + "@50"});
  EXPECT_EQ(due(300), (V{other_session + "@50", session_ + "@200"}));
  // Clearing what was read at 100 leaves the moved one.
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) {
                    return tx.introspection().ClearIntrospectionDue(tenant_, session_, 100);
                  })
                  .ok());
  EXPECT_EQ(due(300), (V{other_session + "@50", session_ + "@200"}));
  ASSERT_TRUE(store_
                  ->WriteSync([&](Tx& tx) {
                    return tx.introspection().ClearIntrospectionDue(tenant_, session_, 200);
                  })
                  .ok());
  EXPECT_EQ(due(300), V{other_session + "@50"});
}

}  // namespace
}  // namespace keel::store
