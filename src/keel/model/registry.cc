#include "keel/model/provider.h"

namespace keel::model {

Status ProviderRegistry::Register(const std::string& name, std::unique_ptr<Provider> provider) {
  if (!providers_.emplace(name, std::move(provider)).second) {
    return InvalidArgument("model provider registered twice: " + name);
  }
  return Status::Ok();
}

Result<Provider*> ProviderRegistry::Resolve(const std::string& model,
                                            std::string* model_name) const {
  std::string provider = model;
  std::string name = model;
  auto slash = model.find('/');
  if (slash != std::string::npos) {
    provider = model.substr(0, slash);
    name = model.substr(slash + 1);
    if (name.empty()) return InvalidArgument("model '" + model + "' names no model after '/'");
  }
  auto it = providers_.find(provider);
  if (it == providers_.end()) {
    std::string known;
    for (const auto& [k, v] : providers_) known += (known.empty() ? "" : ", ") + k;
    return InvalidArgument("unknown model provider '" + provider + "' (configured: " + known + ")");
  }
  if (model_name) *model_name = name;
  return it->second.get();
}

}  // namespace keel::model
