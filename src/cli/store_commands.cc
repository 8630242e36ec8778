#include "cli/store_commands.h"

#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "keel/config/config.h"
#include "keel/store/archive.h"
#include "keel/store/audit.h"
#include "keel/store/migrate.h"
#include "keel/store/rebuild.h"
#include "keel/store/store.h"

namespace keel::cli {
namespace {

std::optional<std::string> NonEmpty(const std::string& s) {
  return s.empty() ? std::nullopt : std::optional<std::string>(s);
}

struct OpenedStore {
  std::unique_ptr<store::Store> store;
  std::string audit_key;  // from KEEL_SECRET_KEK; "" without one
};

// With `read_only`, the store must exist at this keel's schema version, so that opening it
// migrates nothing (a command that only reads its store never changes it).
Result<OpenedStore> OpenConfiguredStore(const StoreCommandArgs& args, bool read_only = false) {
  config::Overrides overrides{NonEmpty(args.home), NonEmpty(args.config_file), std::nullopt,
                              NonEmpty(args.store_url)};
  KEEL_ASSIGN_OR_RETURN(config::Config cfg, config::Load(overrides));
  config::ForgetSecretKekInEnvironment();
  store::StoreOptions options;
  // No command here appends events, so no node origin is needed.
  options.origin = "keel-cli";
  options.sync_full = cfg.durable;
  if (read_only) {
    KEEL_ASSIGN_OR_RETURN(int64_t version, store::StoreSchemaVersion(cfg.store_url));
    const int64_t current = store::SchemaVersionOf(cfg.store_url);
    if (version == 0) return InvalidArgument("no keel store at " + cfg.store_url);
    if (version != current) {
      return InvalidArgument("the store is at schema version " + std::to_string(version) +
                             " and this keel's is " + std::to_string(current) +
                             ": upgrade it with `keel store migrate` first (this command "
                             "only reads it)");
    }
  } else if (!cfg.store_owner_url.empty()) {
    KEEL_RETURN_IF_ERROR(store::MigrateStore(cfg.store_url, cfg.store_owner_url));
  }
  OpenedStore opened;
  // The key signs the heads of chains hashed when opening a store from before the audit
  // chain, and of an old archive's imported events; it checks the signatures.
  KEEL_ASSIGN_OR_RETURN(opened.audit_key, store::AuditKeyFromKek(cfg.secret_kek));
  KEEL_ASSIGN_OR_RETURN(opened.store, store::OpenStore(cfg.store_url, options, opened.audit_key));
  return opened;
}

// The file of a SQLite store URL (sqlite:///path or a bare path); "" for another scheme.
std::string SqlitePathOf(const std::string& url) {
  if (url.rfind("sqlite://", 0) == 0) return url.substr(9);
  return url.find("://") == std::string::npos ? url : std::string();
}

int Finish(std::unique_ptr<store::Store>& s, const Status& st, const std::string& done) {
  s->Close();
  if (!st.ok()) {
    std::cerr << "keel: " << st.message() << "\n";
    return kExitServerError;
  }
  std::cout << done << "\n";
  return kExitOk;
}

// The id of the tenant `id_or_name` names ("" for ""): its id, or its name when one tenant has it.
Result<std::string> TenantIdOf(store::Store& store, const std::string& id_or_name) {
  if (id_or_name.empty()) return std::string();
  std::vector<std::string> named;
  Status st = store.Read([&](store::Tx& tx) -> Status {
    KEEL_ASSIGN_OR_RETURN(auto all, tx.tenants().ListTenants());
    for (const auto& t : all) {
      if (t.id == id_or_name) {
        named = {t.id};
        return Status::Ok();
      }
      if (t.name == id_or_name) named.push_back(t.id);
    }
    return Status::Ok();
  });
  if (!st.ok()) return st;
  if (named.empty()) return NotFound("no tenant has the id or name '" + id_or_name + "'");
  if (named.size() > 1) {
    return InvalidArgument(std::to_string(named.size()) + " tenants are named '" + id_or_name +
                           "': give the id of the one you mean");
  }
  return named.front();
}

}  // namespace

int Export(const StoreCommandArgs& args) {
  auto s = OpenConfiguredStore(args);
  if (!s.ok()) {
    std::cerr << "keel: " << s.status().message() << "\n";
    return kExitServerError;
  }
  auto tenant = TenantIdOf(*s->store, args.tenant);
  if (!tenant.ok()) return Finish(s->store, tenant.status(), "");
  Status st = store::ExportArchive(*s->store, *tenant, args.file);
  return Finish(s->store, st, "exported to " + args.file);
}

int Import(const StoreCommandArgs& args) {
  auto s = OpenConfiguredStore(args);
  if (!s.ok()) {
    std::cerr << "keel: " << s.status().message() << "\n";
    return kExitServerError;
  }
  if (s->audit_key.empty()) {
    std::cerr << "keel: KEEL_SECRET_KEK is not set: the archive's audit chains are checked by "
                 "their hashes only, not their signatures\n";
  }
  Status st = store::ImportArchive(*s->store, args.file, s->audit_key);
  return Finish(s->store, st, "imported " + args.file);
}

int Rebuild(const StoreCommandArgs& args) {
  auto s = OpenConfiguredStore(args, /*read_only=*/true);
  if (!s.ok()) {
    std::cerr << "keel: " << s.status().message() << "\n";
    return s.status().code() == Code::kInvalidArgument ? kExitUsage : kExitServerError;
  }
  if (s->audit_key.empty()) {
    std::cerr << "keel: KEEL_SECRET_KEK is not set: the log's audit chains are checked by their "
                 "hashes only, not their signatures\n";
  }
  // A SQLite target this command creates is removed again when the rebuild fails.
  std::string created = SqlitePathOf(args.into_url);
  std::error_code exists_ec;
  if (created.empty() || std::filesystem::exists(created, exists_ec) || exists_ec) created.clear();
  auto remove_created = [&] {
    std::error_code ec;
    for (const char* suffix : {"", "-wal", "-shm"}) {
      if (!created.empty()) std::filesystem::remove(created + suffix, ec);
    }
  };
  store::StoreOptions options;
  options.origin = "keel-cli";
  auto into = store::OpenStore(args.into_url, options, s->audit_key);
  if (!into.ok()) {
    s->store->Close();
    remove_created();
    std::cerr << "keel: " << args.into_url << ": " << into.status().message() << "\n";
    return kExitServerError;
  }
  auto report = store::RebuildFromEvents(*s->store, **into, s->audit_key);
  (*into)->Close();
  if (!report.ok()) {
    remove_created();
    return Finish(s->store, report.status(), "");
  }
  std::string done = "rebuilt from " + std::to_string(report->events) + " events (" +
                     std::to_string(report->events_with_rows) + " with row images):";
  for (const auto& [table, rows] : report->rows) {
    done += "\n  " + table + ": " + std::to_string(rows) + " rows";
  }
  if (!report->not_rebuilt.empty()) {
    done += "\nleft empty (their events carry no row images yet):";
    for (const auto& table : report->not_rebuilt) done += " " + table;
  }
  return Finish(s->store, Status::Ok(), done);
}

int AuditVerify(const StoreCommandArgs& args) {
  auto s = OpenConfiguredStore(args);
  if (!s.ok()) {
    std::cerr << "keel: " << s.status().message() << "\n";
    return kExitServerError;
  }
  Json reports = Json::array();
  auto tenant = TenantIdOf(*s->store, args.tenant);
  if (!tenant.ok()) return Finish(s->store, tenant.status(), "");
  Status st = s->store->Read([&](store::Tx& tx) -> Status {
    std::vector<std::string> tenants;
    if (!tenant->empty()) {
      KEEL_RETURN_IF_ERROR(tx.tenants().GetTenant(*tenant).status());
      tenants.push_back(*tenant);
    } else {
      KEEL_ASSIGN_OR_RETURN(auto all, tx.tenants().ListTenants());
      for (const auto& t : all) tenants.push_back(t.id);
    }
    for (const auto& tenant : tenants) {
      KEEL_ASSIGN_OR_RETURN(auto chains, store::VerifyTenantChains(tx, s->audit_key, tenant));
      reports.push_back(store::AuditReportJson(tenant, chains));
    }
    return Status::Ok();
  });
  s->store->Close();
  if (!st.ok()) {
    std::cerr << "keel: " << st.message() << "\n";
    return kExitServerError;
  }
  bool all_verified = true;
  for (const auto& r : reports) all_verified = all_verified && r["status"] == "verified";
  if (args.json) {
    std::cout << reports.dump(2) << "\n";
  } else {
    for (const auto& r : reports) {
      std::cout << "tenant " << r["tenant_id"].get<std::string>() << ": "
                << r["status"].get<std::string>() << " (" << r["events"].get<int64_t>()
                << " events in " << r["chains"].size() << " chain(s))\n";
      for (const auto& c : r["chains"]) {
        std::string line = "  origin " + c["origin"].get<std::string>() + ": " +
                           c["status"].get<std::string>() + ", " +
                           std::to_string(c["events"].get<int64_t>()) + " events";
        if (c["signed_after"].is_string()) {
          line += "; signed only after event " + c["signed_after"].get<std::string>();
        }
        if (c["problem"].is_object()) line += "\n    " + c["problem"]["message"].get<std::string>();
        std::cout << line << "\n";
      }
    }
  }
  if (s->audit_key.empty()) {
    std::cerr << "keel: KEEL_SECRET_KEK is not set: the chains' hashes were checked, their "
                 "signatures were not\n";
  }
  return all_verified ? kExitOk : kExitServerError;
}

int Migrate(const StoreCommandArgs& args) {
  config::Overrides overrides{NonEmpty(args.home), NonEmpty(args.config_file), std::nullopt,
                              NonEmpty(args.store_url)};
  auto cfg = config::Load(overrides);
  Status st = cfg.status();
  const bool postgres = st.ok() && (cfg->store_url.rfind("postgres://", 0) == 0 ||
                                    cfg->store_url.rfind("postgresql://", 0) == 0);
  const std::string owner = args.owner_url.empty() && cfg.ok() ? cfg->store_owner_url
                                                               : args.owner_url;
  if (st.ok() && postgres && owner.empty()) {
    st = InvalidArgument("no owner role: give --owner-url, or set store_owner (KEEL_STORE_OWNER)");
  }
  if (st.ok() && !postgres && !args.owner_url.empty()) {
    st = InvalidArgument("--owner-url applies to a PostgreSQL store only");
  }
  Result<int64_t> before =
      st.ok() ? store::StoreSchemaVersion(cfg->store_url) : Result<int64_t>(st);
  if (!before.ok()) st = before.status();
  if (st.ok() && !postgres) {
    // Migrating is for a store that exists: `keel serve` creates a new one.
    const std::string path = SqlitePathOf(cfg->store_url);
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) st = InvalidArgument("no SQLite store at " + path);
  }
  if (st.ok() && postgres) {
    st = store::MigrateStore(cfg->store_url, owner);
  } else if (st.ok()) {
    // A SQLite store migrates as it opens (and hashes events from before the audit chain,
    // which needs KEEL_SECRET_KEK to sign their heads).
    auto opened = OpenConfiguredStore(args);
    if (opened.ok()) opened->store->Close();
    st = opened.status();
  }
  Result<int64_t> after = st.ok() ? store::StoreSchemaVersion(cfg->store_url) : Result<int64_t>(st);
  if (!after.ok()) {
    std::cerr << "keel: " << after.status().message() << "\n";
    return after.status().code() == Code::kInvalidArgument ? kExitUsage : kExitServerError;
  }
  if (*after == *before) {
    std::cout << "schema version " << *after << ": current, nothing to apply\n";
  } else {
    const int64_t n = *after - *before;
    std::cout << "schema version " << *before << " -> " << *after << ": " << n
              << (n == 1 ? " migration" : " migrations") << " applied\n";
  }
  if (postgres) std::cout << "the store's runtime role has its rights\n";
  return kExitOk;
}

}  // namespace keel::cli
