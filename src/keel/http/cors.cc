#include "keel/http/cors.h"

#include <algorithm>

namespace keel::http {

namespace {

constexpr const char* kMethods = "GET, POST, PUT, PATCH, DELETE, OPTIONS";
// What Keel's routes read from a request beyond the CORS-safelisted headers.
constexpr const char* kHeaders =
    "Authorization, Content-Type, Idempotency-Key, Last-Event-ID, Mcp-Session-Id, "
    "Mcp-Protocol-Version, X-Keel-Session, X-Keel-Wait";
// What a page may read of an answer beyond the safelisted ones.
constexpr const char* kExposed =
    "X-Keel-Session, X-Keel-Run, Mcp-Session-Id, Retry-After, WWW-Authenticate, x-should-retry";

bool IsOrigin(const std::string& o) {
  const size_t scheme_end = o.find("://");
  if (scheme_end == std::string::npos) return false;
  const std::string scheme = o.substr(0, scheme_end);
  if (scheme != "http" && scheme != "https") return false;
  const std::string rest = o.substr(scheme_end + 3);
  if (rest.empty()) return false;
  for (char c : rest) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
                    c == ':' || c == '[' || c == ']';
    if (!ok) return false;
  }
  // A port after the last colon outside an IPv6 literal's brackets.
  const size_t colon = rest.rfind(':');
  const size_t bracket = rest.rfind(']');
  if (colon == std::string::npos || (bracket != std::string::npos && colon < bracket)) return true;
  const std::string port = rest.substr(colon + 1);
  if (colon == 0 || port.empty() || port.size() > 5) return false;
  if (!std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return false;
  }
  return std::stoi(port) <= 65535;
}

}  // namespace

bool CorsPolicy::Allows(const std::string& origin) const {
  if (origin.empty()) return false;
  for (const auto& o : origins) {
    if (o == "*" || o == origin) return true;
  }
  return false;
}

Status CheckCorsOrigins(const std::string& what, const std::vector<std::string>& origins) {
  for (const auto& o : origins) {
    if (o != "*" && !IsOrigin(o)) {
      return InvalidArgument(what + ": '" + o +
                             "' is not an origin: \"*\" or scheme://host[:port] (http or https, "
                             "lower-case, no path or trailing slash)");
    }
  }
  return Status::Ok();
}

std::optional<Response> Preflight(const CorsPolicy& policy, const Request& request) {
  if (request.method != "OPTIONS" || request.Header("access-control-request-method").empty()) {
    return std::nullopt;
  }
  const std::string origin = request.Header("origin");
  Response r;
  r.headers["Vary"] = "Origin";
  if (!policy.Allows(origin)) {
    r = Response::Error(PermissionDenied(
        "cross-origin requests from '" + origin +
        "' are not allowed (the server setting cors_origins lists the pages that may call it)"));
    r.headers["Vary"] = "Origin";
    return r;
  }
  r.status = 204;
  r.content_type.clear();
  r.headers["Access-Control-Allow-Origin"] = origin;
  r.headers["Access-Control-Allow-Methods"] = kMethods;
  r.headers["Access-Control-Allow-Headers"] = kHeaders;
  r.headers["Access-Control-Max-Age"] = "600";
  return r;
}

void AllowCrossOrigin(const CorsPolicy& policy, const Request& request, Response& response) {
  if (policy.origins.empty()) return;
  response.headers["Vary"] = "Origin";
  const std::string origin = request.Header("origin");
  if (!policy.Allows(origin)) return;
  response.headers["Access-Control-Allow-Origin"] = origin;
  response.headers["Access-Control-Expose-Headers"] = kExposed;
}

}  // namespace keel::http
