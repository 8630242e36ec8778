#include "cli/store_commands.h"

#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "keel/config/config.h"
#include "keel/store/archive.h"
#include "keel/store/migrate.h"
#include "keel/store/store.h"

namespace keel::cli {
namespace {

std::optional<std::string> NonEmpty(const std::string& s) {
  return s.empty() ? std::nullopt : std::optional<std::string>(s);
}

Result<std::unique_ptr<store::Store>> OpenConfiguredStore(const StoreCommandArgs& args) {
  config::Overrides overrides{NonEmpty(args.home), NonEmpty(args.config_file), std::nullopt,
                              NonEmpty(args.store_url)};
  KEEL_ASSIGN_OR_RETURN(config::Config cfg, config::Load(overrides));
  store::StoreOptions options;
  // Neither command appends events, so no node origin is needed.
  options.origin = "keel-cli";
  options.sync_full = cfg.durable;
  if (!cfg.store_owner_url.empty()) {
    KEEL_RETURN_IF_ERROR(store::MigrateStore(cfg.store_url, cfg.store_owner_url));
  }
  return store::OpenStore(cfg.store_url, options);
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

}  // namespace

int Export(const StoreCommandArgs& args) {
  auto s = OpenConfiguredStore(args);
  if (!s.ok()) {
    std::cerr << "keel: " << s.status().message() << "\n";
    return kExitServerError;
  }
  Status st = store::ExportArchive(**s, args.tenant, args.file);
  return Finish(*s, st, "exported to " + args.file);
}

int Import(const StoreCommandArgs& args) {
  auto s = OpenConfiguredStore(args);
  if (!s.ok()) {
    std::cerr << "keel: " << s.status().message() << "\n";
    return kExitServerError;
  }
  Status st = store::ImportArchive(**s, args.file);
  return Finish(*s, st, "imported " + args.file);
}

int Migrate(const StoreCommandArgs& args) {
  config::Overrides overrides{NonEmpty(args.home), NonEmpty(args.config_file), std::nullopt,
                              NonEmpty(args.store_url)};
  auto cfg = config::Load(overrides);
  Status st = cfg.status();
  const std::string owner = args.owner_url.empty() && cfg.ok() ? cfg->store_owner_url
                                                               : args.owner_url;
  if (st.ok() && owner.empty()) {
    st = InvalidArgument("no owner role: give --owner-url, or set store_owner (KEEL_STORE_OWNER)");
  }
  if (st.ok()) st = store::MigrateStore(cfg->store_url, owner);
  if (!st.ok()) {
    std::cerr << "keel: " << st.message() << "\n";
    return st.code() == Code::kInvalidArgument ? kExitUsage : kExitServerError;
  }
  std::cout << "the store's schema is current, and its runtime role has its rights\n";
  return kExitOk;
}

}  // namespace keel::cli
