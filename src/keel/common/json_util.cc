#include "keel/common/json_util.h"

namespace keel {

Result<Json> ParseJson(std::string_view text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument("request body is not valid JSON");
  return j;
}

Result<Json> ParseJsonObject(std::string_view text) {
  if (text.empty()) return Json::object();
  KEEL_ASSIGN_OR_RETURN(Json j, ParseJson(text));
  if (!j.is_object()) return InvalidArgument("request body must be a JSON object");
  return j;
}

Result<std::string> OptString(const Json& obj, const char* field, std::string fallback) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) return InvalidArgument(std::string("field '") + field + "' must be a string");
  return it->get<std::string>();
}

Result<std::string> ReqString(const Json& obj, const char* field) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) {
    return InvalidArgument(std::string("field '") + field + "' is required");
  }
  if (!it->is_string()) return InvalidArgument(std::string("field '") + field + "' must be a string");
  std::string v = it->get<std::string>();
  if (v.empty()) return InvalidArgument(std::string("field '") + field + "' must not be empty");
  return v;
}

std::string DumpJson(const Json& j) {
  return j.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string ErrorBody(const Status& status) {
  Json body = {{"error", {{"code", std::string(CodeName(status.code()))}, {"message", status.message()}}}};
  return DumpJson(body);
}

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid_argument";
    case Code::kUnauthenticated: return "unauthenticated";
    case Code::kPermissionDenied: return "permission_denied";
    case Code::kNotFound: return "not_found";
    case Code::kConflict: return "conflict";
    case Code::kPayloadTooLarge: return "payload_too_large";
    case Code::kRateLimited: return "rate_limited";
    case Code::kUnavailable: return "unavailable";
    case Code::kInternal: return "internal";
  }
  return "internal";
}

int HttpStatusOf(Code code) {
  switch (code) {
    case Code::kOk: return 200;
    case Code::kInvalidArgument: return 400;
    case Code::kUnauthenticated: return 401;
    case Code::kPermissionDenied: return 403;
    case Code::kNotFound: return 404;
    case Code::kConflict: return 409;
    case Code::kPayloadTooLarge: return 413;
    case Code::kRateLimited: return 429;
    case Code::kUnavailable: return 503;
    case Code::kInternal: return 500;
  }
  return 500;
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName(code_)) + ": " + message_;
}

}  // namespace keel
