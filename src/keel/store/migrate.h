#pragma once
// Preparing a store's schema as the role that owns it, apart from opening the store.
//
// A PostgreSQL store runs as a runtime role that owns nothing (its URL is the store URL); the
// schema belongs to an owner role, whose URL (`store_owner`, KEEL_STORE_OWNER,
// `keel store migrate --owner-url`) is used only here: to apply the migrations and grant the
// runtime role its rights (docs/decisions/0008-postgres-owner-and-runtime-roles.md). OpenStore
// then refuses a PostgreSQL store whose schema is missing or behind. SQLite has no roles: its
// store migrates itself when opened.

#include <string>

#include "keel/common/status.h"

namespace keel::store {

// Applies the pending migrations of the PostgreSQL store `url` as the role of `owner_url` and
// grants `url`'s role what it needs; kInvalidArgument for a SQLite URL.
[[nodiscard]] Status MigrateStore(const std::string& url, const std::string& owner_url);

}  // namespace keel::store
