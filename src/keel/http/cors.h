#pragma once
// Cross-origin requests from browser pages (the Fetch standard's CORS protocol): which pages
// may call the API, and the headers that tell the browser so. No answer allows credentials:
// other origins' pages call with bearer tokens, and the dashboard's cookie (session_cookie.h)
// serves only the server's own pages.

#include <optional>
#include <string>
#include <vector>

#include "keel/common/status.h"
#include "keel/http/types.h"

namespace keel::http {

struct CorsPolicy {
  // Exact origins ("https://app.example.com", "http://localhost:5173"), or "*" for any. Empty:
  // no cross-origin page may read an answer (the default).
  std::vector<std::string> origins;

  bool Allows(const std::string& origin) const;
};

// "*", or scheme://host[:port] with scheme http or https, lower-case, no path: what the
// setting takes. `what` names the setting in the error.
Status CheckCorsOrigins(const std::string& what, const std::vector<std::string>& origins);

// A preflight (OPTIONS with Access-Control-Request-Method), answered without the router: 204
// with what the page may send when its origin is allowed, 403 otherwise. nullopt: not one.
std::optional<Response> Preflight(const CorsPolicy& policy, const Request& request);

// Lets the page of an allowed origin read `response` (and the headers Keel's clients read).
void AllowCrossOrigin(const CorsPolicy& policy, const Request& request, Response& response);

}  // namespace keel::http
