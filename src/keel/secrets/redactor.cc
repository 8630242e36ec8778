#include "keel/secrets/redactor.h"

#include <boost/url/encode.hpp>
#include <boost/url/rfc/unreserved_chars.hpp>

#include <algorithm>

#include "keel/common/crypto.h"

namespace keel::secrets {

Status Redactor::Add(const std::string& name, const std::string& value) {
  if (value.size() < kMinBytes) {
    return InvalidArgument("secret " + name + " is shorter than " + std::to_string(kMinBytes) +
                           " bytes: too short to be kept out of what the server sends back");
  }
  const std::string replacement = "[secret:" + name + "]";
  std::string json = DumpJson(Json(value));
  std::string url_safe = Base64UrlEncode(value);
  std::string standard = url_safe;
  std::replace(standard.begin(), standard.end(), '-', '+');
  std::replace(standard.begin(), standard.end(), '_', '/');
  for (std::string form : {value, json.substr(1, json.size() - 2), boost::urls::encode(value, boost::urls::unreserved_chars),
                           url_safe, standard}) {
    bool known = std::any_of(forms_.begin(), forms_.end(),
                             [&](const auto& f) { return f.first == form; });
    if (!known) forms_.emplace_back(std::move(form), replacement);
  }
  std::stable_sort(forms_.begin(), forms_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  return Status::Ok();
}

std::string Redactor::Text(std::string text) const {
  for (const auto& [form, replacement] : forms_) {
    size_t pos = 0;
    while ((pos = text.find(form, pos)) != std::string::npos) {
      text.replace(pos, form.size(), replacement);
      pos += replacement.size();
    }
  }
  return text;
}

Json Redactor::Value(Json value) const {
  if (forms_.empty()) return value;
  if (value.is_string()) return Text(value.get<std::string>());
  if (value.is_array()) {
    for (auto& item : value) item = Value(std::move(item));
    return value;
  }
  if (value.is_object()) {
    Json out = Json::object();
    for (auto it = value.begin(); it != value.end(); ++it) {
      out[Text(it.key())] = Value(std::move(it.value()));
    }
    return out;
  }
  return value;
}

Status Redactor::Error(const Status& status) const {
  if (status.ok() || forms_.empty()) return status;
  return Status(status.code(), Text(status.message()));
}

}  // namespace keel::secrets
