#pragma once
// Fresh PostgreSQL databases for tests: KEEL_TEST_PG_ADMIN_URL names a role that may create
// databases (`make test` starts a throwaway cluster and sets it; see scripts/with-pg.sh). Each
// PgTestDatabase is a new database `keel_t_<random>` owned by the owner role `keel_owner` (or the
// user of KEEL_TEST_PG_OWNER_URL), migrated by it, and used through url() as the runtime role
// `keel` (or the user of KEEL_TEST_PG_URL), which owns nothing; dropped on destruction. Without
// the variable Create() fails with kPgSkip. Shared by the store conformance suite and the
// archive tests.

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <string>

#include "keel/common/status.h"
#include "keel/common/time.h"
#include "keel/store/migrate.h"

namespace keel::store {
namespace {

constexpr const char* kPgSkip =
    "PostgreSQL cases are off: set KEEL_TEST_PG_ADMIN_URL to a server role with CREATEDB "
    "(`make test` starts a throwaway cluster and sets it; or run the binary under "
    "scripts/with-pg.sh)";

const char* PgAdminUrl() {
  const char* v = std::getenv("KEEL_TEST_PG_ADMIN_URL");
  return v && *v ? v : nullptr;
}

// postgres://[userinfo@]hostport[/db][?query], split so that user and database can be swapped.
struct PgUrl {
  std::string scheme;  // "postgres://"
  std::string userinfo;
  std::string hostport;
  std::string db;
  std::string query;  // "?..." or empty

  static PgUrl Parse(const std::string& url) {
    PgUrl p;
    size_t s = url.find("://");
    std::string rest = url;
    if (s != std::string::npos) {
      p.scheme = url.substr(0, s + 3);
      rest = url.substr(s + 3);
    }
    if (size_t q = rest.find('?'); q != std::string::npos) {
      p.query = rest.substr(q);
      rest.resize(q);
    }
    if (size_t slash = rest.find('/'); slash != std::string::npos) {
      p.db = rest.substr(slash + 1);
      rest.resize(slash);
    }
    if (size_t at = rest.rfind('@'); at != std::string::npos) {
      p.userinfo = rest.substr(0, at);
      p.hostport = rest.substr(at + 1);
    } else {
      p.hostport = rest;
    }
    return p;
  }
  std::string user() const { return userinfo.substr(0, userinfo.find(':')); }
  std::string str() const {
    return scheme + (userinfo.empty() ? "" : userinfo + "@") + hostport + "/" + db + query;
  }
};

void IgnoreNotice(void*, const char*) {}

// Runs one statement on a fresh connection to `conninfo`.
Status PgExec(const std::string& conninfo, const std::string& sql) {
  PGconn* c = PQconnectdb(conninfo.c_str());
  if (PQstatus(c) != CONNECTION_OK) {
    std::string err = PQerrorMessage(c);
    PQfinish(c);
    return Unavailable("cannot connect to KEEL_TEST_PG_ADMIN_URL: " + err);
  }
  PQsetNoticeProcessor(c, IgnoreNotice, nullptr);
  PGresult* r = PQexec(c, sql.c_str());
  Status st;
  if (PQresultStatus(r) != PGRES_COMMAND_OK && PQresultStatus(r) != PGRES_TUPLES_OK) {
    st = Internal(sql + ": " + PQresultErrorMessage(r));
  }
  PQclear(r);
  PQfinish(c);
  return st;
}

std::string RandomDbName() {
  static std::mt19937_64 rng(std::random_device{}() ^ static_cast<uint64_t>(NowMillis()) ^
                             (static_cast<uint64_t>(::getpid()) << 32));
  static const char* kHex = "0123456789abcdef";
  std::string name = "keel_t_";
  for (int i = 0; i < 16; ++i) name += kHex[rng() % 16];
  return name;
}

// A fresh database on the server of KEEL_TEST_PG_ADMIN_URL, dropped on destruction.
class PgTestDatabase {
 public:
  PgTestDatabase() = default;
  PgTestDatabase(const PgTestDatabase&) = delete;
  PgTestDatabase& operator=(const PgTestDatabase&) = delete;
  ~PgTestDatabase() { Drop(); }

  // `migrate` false: an empty database, for a test that builds an older schema itself.
  Status Create(bool migrate = true) {
    const char* admin = PgAdminUrl();
    if (!admin) return InvalidArgument(kPgSkip);
    admin_ = admin;
    // The store connects as the runtime role: KEEL_TEST_PG_URL's user, else `keel` on the admin
    // URL's server; the schema belongs to KEEL_TEST_PG_OWNER_URL's user, else `keel_owner`.
    PgUrl store = PgUrl::Parse(admin_);
    store.userinfo = "keel";
    if (const char* u = std::getenv("KEEL_TEST_PG_URL"); u && *u) store = PgUrl::Parse(u);
    PgUrl owner = PgUrl::Parse(admin_);
    owner.userinfo = "keel_owner";
    if (const char* u = std::getenv("KEEL_TEST_PG_OWNER_URL"); u && *u) owner = PgUrl::Parse(u);
    name_ = RandomDbName();
    store.db = name_;
    owner.db = name_;
    url_ = store.str();
    owner_url_ = owner.str();
    Status st = PgExec(admin_, "CREATE DATABASE " + name_ + " OWNER \"" + owner.user() + "\"");
    if (!st.ok()) {
      name_.clear();
      return st;
    }
    return migrate ? Migrate() : Status::Ok();
  }
  // Migrates (again) as the owner role; Create() did it once.
  Status Migrate() { return MigrateStore(url_, owner_url_); }
  void Drop() {
    if (name_.empty()) return;
    Status st = PgExec(admin_, "DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)");
    EXPECT_TRUE(st.ok()) << st.ToString();
    name_.clear();
  }
  const std::string& url() const { return url_; }              // as the runtime role
  const std::string& owner_url() const { return owner_url_; }  // as the owner role
  const std::string& admin_url() const { return admin_; }
  const std::string& name() const { return name_; }

 private:
  std::string admin_;
  std::string name_;
  std::string url_;
  std::string owner_url_;
};

}  // namespace
}  // namespace keel::store
