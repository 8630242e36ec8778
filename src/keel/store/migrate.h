#pragma once
// Preparing a store's schema as the role that owns it, apart from opening the store.
//
// A PostgreSQL store runs as a runtime role that owns nothing (its URL is the store URL); the
// schema belongs to an owner role, whose URL (`store_owner`, KEEL_STORE_OWNER,
// `keel store migrate --owner-url`) is used only here: to apply the migrations and grant the
// runtime role its rights (docs/decisions/0008-postgres-owner-and-runtime-roles.md). OpenStore
// then refuses a PostgreSQL store whose schema is missing or behind. SQLite has no roles: its
// store migrates itself when opened.

#include <cstdint>
#include <string>

#include "keel/common/status.h"

namespace keel::store {

// Applies the pending migrations of the PostgreSQL store `url` as the role of `owner_url` and
// grants `url`'s role what it needs; kInvalidArgument for a SQLite URL.
[[nodiscard]] Status MigrateStore(const std::string& url, const std::string& owner_url);

// How many migrations the store at `url` has applied (0 for a store not created yet), read as
// its URL's role without changing anything; and how many this keel brings for its backend. A
// store opens only at this keel's version: SQLite migrates as it opens, PostgreSQL needs
// MigrateStore first.
[[nodiscard]] Result<int64_t> StoreSchemaVersion(const std::string& url);
int64_t SchemaVersionOf(const std::string& url);

}  // namespace keel::store
