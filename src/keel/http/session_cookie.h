#pragma once
// The dashboard's sign-in cookie. A browser that signed in holds a token of its own (a dashboard
// sign-in, store::Token.parent_id) in an HttpOnly, SameSite=Strict cookie that no script can
// read. The router takes it where a request has no bearer token; a write (any method but GET,
// HEAD) must also carry the sign-in's CSRF token in X-Keel-CSRF, and a request that names an
// Origin must come from the server's own.

#include <string>
#include <string_view>

#include "keel/http/types.h"

namespace keel::http {

inline constexpr const char* kSessionCookie = "keel_session";
inline constexpr const char* kCsrfHeader = "x-keel-csrf";

// The value of cookie `name` in the request's Cookie header, "" when absent.
std::string CookieValue(const Request& request, std::string_view name);

// The CSRF token of the sign-in whose secret is `secret`: derived from it, so that only a page
// the server told it (GET /v1/dashboard/session) can send it.
std::string CsrfTokenFor(std::string_view secret);

// The Set-Cookie value that stores `secret` for `max_age_s` seconds (0 clears the cookie).
// Secure unless the request came to a loopback host by plain HTTP (browsers keep Secure
// cookies there too, but a reverse proxy's TLS is what the flag is for).
std::string SessionCookie(const Request& request, const std::string& secret, long max_age_s);

// Whether a cookie-authenticated request may go on: kPermissionDenied for a write without the
// right X-Keel-CSRF, or an Origin other than the request's own host.
Status CheckCookieRequest(const Request& request, std::string_view secret);

}  // namespace keel::http
