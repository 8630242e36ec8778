// The SQLite connection layer (store/sqlite/sqlite_db.h): PostgreSQL's $N parameters read as
// ?N outside quoted text, and a cached statement that is not handed out twice while stepping.

#include "keel/store/sqlite/sqlite_db.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace keel::store::sqlite {
namespace {

class SqliteDbTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = std::filesystem::temp_directory_path() /
            ("keel-sqlite-db-" + std::to_string(::getpid()) + ".db");
    std::filesystem::remove(path_);
    auto db = Db::Open(path_.string(), /*read_only=*/false, /*sync_full=*/false);
    ASSERT_TRUE(db.ok()) << db.status().ToString();
    db_ = std::move(*db);
    ASSERT_TRUE(db_->Exec("CREATE TABLE t(a TEXT, b INTEGER)").ok());
  }
  void TearDown() override {
    db_.reset();
    std::filesystem::remove(path_);
    std::filesystem::remove(path_.string() + "-wal");
    std::filesystem::remove(path_.string() + "-shm");
  }

  std::filesystem::path path_;
  std::unique_ptr<Db> db_;
};

TEST_F(SqliteDbTest, DollarParametersBindByTheirNumber) {
  SqliteSql sql(*db_);
  // $2 is used before $1: SQLite's own reading of "$2" would number it 1.
  ASSERT_TRUE(sql.Exec("INSERT INTO t(b, a) VALUES($2, $1)", std::string("x"), int64_t{7}).ok());
  auto r = sql.Query("SELECT a, b FROM t WHERE a=$1 AND b=$2", std::string("x"), int64_t{7});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto row = r->Step();
  ASSERT_TRUE(row.ok() && *row);
  EXPECT_EQ(r->Text(0), "x");
  EXPECT_EQ(r->Int(1), 7);
}

TEST_F(SqliteDbTest, DollarDigitsInQuotedTextStayText) {
  SqliteSql sql(*db_);
  ASSERT_TRUE(sql.Exec("INSERT INTO t(a, b) VALUES('costs $1 (''$2'')', $1)", int64_t{1}).ok());
  auto r = sql.Query("SELECT a FROM t WHERE b=$1", int64_t{1});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto row = r->Step();
  ASSERT_TRUE(row.ok() && *row);
  EXPECT_EQ(r->Text(0), "costs $1 ('$2')");
}

TEST_F(SqliteDbTest, AStatementStillSteppingIsNotHandedOutAgain) {
  ASSERT_TRUE(db_->Exec("INSERT INTO t VALUES('a', 1), ('b', 2)").ok());
  const std::string kSql = "SELECT a FROM t ORDER BY a";
  {
    auto first = db_->Prepare(kSql);
    ASSERT_TRUE(first.ok());
    auto row = first->Step();
    ASSERT_TRUE(row.ok() && *row);
    auto again = db_->Prepare(kSql);
    ASSERT_FALSE(again.ok());
    EXPECT_EQ(again.status().code(), Code::kInternal);
    EXPECT_EQ(first->Text(0), "a");  // the first reader's row is intact
  }
  auto after = db_->Prepare(kSql);  // reset when the first Stmt went
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  auto row = after->Step();
  ASSERT_TRUE(row.ok() && *row);
  EXPECT_EQ(after->Text(0), "a");
}

}  // namespace
}  // namespace keel::store::sqlite
