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

// The value of cookie `name` in the request's Cookie header, "" when absent. kUnauthenticated
// when it is there more than once: a page of the same site may have planted one of its own
// (under another path), and a request must not be taken as the wrong sign-in.
Result<std::string> CookieValue(const Request& request, std::string_view name);

// The CSRF token of the sign-in whose secret is `secret`: derived from it, so that only a page
// the server told it (GET /v1/dashboard/session) can send it.
std::string CsrfTokenFor(std::string_view secret);

// The Set-Cookie value that stores `secret` for `max_age_s` seconds (0 clears the cookie).
// Secure when the page is https (its Origin says so) or the host is not a loopback one; only a
// plain-HTTP page on localhost, 127.0.0.1 or [::1] gets a cookie without it.
std::string SessionCookie(const Request& request, const std::string& secret, long max_age_s);

// kPermissionDenied when the request names an Origin other than its own host's
// (http://HOST or https://HOST).
Status CheckOrigin(const Request& request);

// Whether a cookie-authenticated request may go on: CheckOrigin, and kPermissionDenied for a
// write without the right X-Keel-CSRF.
Status CheckCookieRequest(const Request& request, std::string_view secret);

}  // namespace keel::http
