#include "keel/http/session_cookie.h"

#include "keel/common/crypto.h"

namespace keel::http {

namespace {
std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool LoopbackHost(std::string_view host) {
  // Host is host[:port]; an IPv6 literal is bracketed.
  if (host.starts_with("[::1]")) return true;
  host = host.substr(0, host.find(':'));
  return host == "localhost" || host == "127.0.0.1";
}
}  // namespace

Result<std::string> CookieValue(const Request& request, std::string_view name) {
  std::string header = request.Header("cookie");
  std::string_view rest = header;
  std::optional<std::string> found;
  while (!rest.empty()) {
    size_t semi = rest.find(';');
    std::string_view pair = Trim(rest.substr(0, semi));
    rest = semi == std::string_view::npos ? std::string_view() : rest.substr(semi + 1);
    size_t eq = pair.find('=');
    if (eq == std::string_view::npos || Trim(pair.substr(0, eq)) != name) continue;
    std::string_view value = Trim(pair.substr(eq + 1));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    }
    if (found) return Unauthenticated("more than one " + std::string(name) + " cookie");
    found = std::string(value);
  }
  return found.value_or("");
}

std::string CsrfTokenFor(std::string_view secret) {
  return HmacSha256Hex(secret, "keel dashboard csrf");
}

std::string SessionCookie(const Request& request, const std::string& secret, long max_age_s) {
  std::string cookie = std::string(kSessionCookie) + "=" + secret +
                       "; Path=/; HttpOnly; SameSite=Strict; Max-Age=" + std::to_string(max_age_s);
  if (request.Header("origin").rfind("https://", 0) == 0 || !LoopbackHost(request.Header("host"))) {
    cookie += "; Secure";
  }
  return cookie;
}

Status CheckOrigin(const Request& request) {
  std::string origin = request.Header("origin");
  if (origin.empty()) return Status::Ok();
  std::string host = request.Header("host");
  if (origin != "http://" + host && origin != "https://" + host) {
    return PermissionDenied(
        "the dashboard's sign-in is used only by pages of this server (Origin " +
        origin.substr(0, 200) + "); behind a reverse proxy, pass the Host header through");
  }
  return Status::Ok();
}

Status CheckCookieRequest(const Request& request, std::string_view secret) {
  KEEL_RETURN_IF_ERROR(CheckOrigin(request));
  if (request.method == "GET" || request.method == "HEAD") return Status::Ok();
  if (!ConstantTimeEquals(request.Header(kCsrfHeader), CsrfTokenFor(secret))) {
    return PermissionDenied(
        "a write signed in by the dashboard's cookie needs its X-Keel-CSRF header "
        "(GET /v1/dashboard/session tells it)");
  }
  return Status::Ok();
}

}  // namespace keel::http
