#pragma once
// The CLI commands that open the store directly instead of talking to a server:
// `keel export [--tenant T] FILE` and `keel import FILE` (store/archive.h), and
// `keel store migrate [--owner-url URL]` (store/migrate.h), `keel store rebuild --from-events
// --into URL` (store/rebuild.h), and `keel audit verify`
// (store/audit.h). The store comes from the configuration
// as for `keel serve` (--store, KEEL_STORE, keel.toml, --home); a configured store_owner
// (KEEL_STORE_OWNER) migrates a PostgreSQL store first.
//
// Export may run while a server uses the store: it reads one consistent snapshot (a SQLite WAL
// reader, a PostgreSQL transaction). Import refuses a store that holds any data, so run it on a
// new store before starting the server on it.

#include <string>

namespace keel::cli {

struct StoreCommandArgs {
  std::string home;         // empty: $KEEL_HOME, else the default
  std::string config_file;  // empty: $home/keel.toml
  std::string store_url;    // empty: the configured store
  std::string owner_url;    // migrate only; empty: the configured store_owner
  std::string tenant;       // export and audit verify; empty: every tenant
  std::string file;
  std::string into_url;     // store rebuild: the new store's URL
  bool json = false;        // audit verify: the report as JSON
};

// Both return an ExitCode (cli/commands.h) and report errors on stderr.
int Export(const StoreCommandArgs& args);
int Import(const StoreCommandArgs& args);
int Migrate(const StoreCommandArgs& args);
// `keel store rebuild --from-events --into URL`: the configured store's tables rebuilt from its
// event log into the new, empty store at URL (store/rebuild.h); prints what it rebuilt.
int Rebuild(const StoreCommandArgs& args);
// `keel audit verify [--tenant T]`: every tenant's audit chains (store/audit.h), with the key
// from KEEL_SECRET_KEK. Exit 0 when every chain is verified; 1 when one was tampered with, or
// could not be fully checked (unsigned heads, no KEEL_SECRET_KEK), saying which.
int AuditVerify(const StoreCommandArgs& args);

}  // namespace keel::cli
