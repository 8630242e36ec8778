#include "cli/store_commands.h"

#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "keel/config/config.h"
#include "keel/store/archive.h"
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

}  // namespace keel::cli
