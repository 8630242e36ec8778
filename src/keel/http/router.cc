#include "keel/http/router.h"

#include <boost/asio/use_awaitable.hpp>
#include <cctype>

#include "keel/http/session_cookie.h"

namespace keel::http {

namespace {
std::vector<std::string> Split(const std::string& path) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < path.size()) {
    if (path[i] == '/') {
      ++i;
      continue;
    }
    size_t j = path.find('/', i);
    if (j == std::string::npos) j = path.size();
    out.push_back(path.substr(i, j - i));
    i = j;
  }
  return out;
}
}  // namespace

std::string Request::Header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? "" : it->second;
}
bool Request::IsWebSocketUpgrade() const {
  auto lower = [](std::string s) {
    for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  };
  // Connection is a comma-separated list of tokens ("keep-alive, Upgrade").
  std::string connection = lower(Header("connection"));
  bool upgrade = false;
  size_t i = 0;
  while (i <= connection.size()) {
    size_t j = connection.find(',', i);
    if (j == std::string::npos) j = connection.size();
    std::string token = connection.substr(i, j - i);
    token.erase(0, token.find_first_not_of(" \t"));
    token.erase(token.find_last_not_of(" \t") + 1);
    if (token == "upgrade") upgrade = true;
    i = j + 1;
  }
  return method == "GET" && upgrade && lower(Header("upgrade")) == "websocket";
}

std::string Request::Param(const std::string& name) const {
  auto it = params.find(name);
  return it == params.end() ? "" : it->second;
}
std::string Request::Query(const std::string& name, const std::string& fallback) const {
  auto it = query.find(name);
  return it == query.end() ? fallback : it->second;
}

Response Response::Json(int status, const keel::Json& body) {
  Response r;
  r.status = status;
  r.body = DumpJson(body);
  return r;
}

Response Response::Error(const Status& status) {
  Response r;
  r.status = HttpStatusOf(status.code());
  r.body = ErrorBody(status);
  if (status.code() == Code::kUnauthenticated) r.headers["WWW-Authenticate"] = "Bearer";
  return r;
}

Response Response::NoContent() {
  Response r;
  r.status = 204;
  r.content_type.clear();
  return r;
}

void Router::Add(const std::string& method, const std::string& pattern, Handler handler,
                 bool requires_auth, ErrorRenderer render_error) {
  routes_.push_back(Route{method, Split(pattern), std::move(handler), requires_auth, render_error});
}

boost::asio::awaitable<Response> Router::Dispatch(Request& request) const {
  auto segments = Split(request.path);
  bool path_matched = false;
  for (const auto& route : routes_) {
    if (route.segments.size() != segments.size()) continue;
    std::map<std::string, std::string> params;
    bool ok = true;
    for (size_t i = 0; i < segments.size() && ok; ++i) {
      const auto& pat = route.segments[i];
      if (pat.size() > 2 && pat.front() == '{' && pat.back() == '}') {
        params[pat.substr(1, pat.size() - 2)] = segments[i];
      } else {
        ok = pat == segments[i];
      }
    }
    if (!ok) continue;
    path_matched = true;
    if (route.method != request.method) continue;
    const ErrorRenderer error = route.render_error ? route.render_error : &Response::Error;
    if (route.requires_auth) {
      std::string auth = request.Header("authorization");
      std::string token;
      if (auth.size() > 7 && (auth.compare(0, 7, "Bearer ") == 0 || auth.compare(0, 7, "bearer ") == 0)) {
        token = auth.substr(7);
      }
      // Without a bearer token, a dashboard sign-in's cookie (session_cookie.h).
      const bool by_cookie = token.empty();
      if (by_cookie) {
        auto cookie = CookieValue(request, kSessionCookie);
        if (!cookie.ok()) co_return error(cookie.status());
        token = *cookie;
      }
      if (token.empty()) {
        co_return error(Unauthenticated("missing bearer token (Authorization: Bearer ...)"));
      }
      request.params = params;
      auto principal = co_await authenticate_(token, request);
      if (!principal.ok()) co_return error(principal.status());
      if (by_cookie) {
        if (principal->browser_session_id.empty()) {
          co_return error(Unauthenticated("the keel_session cookie holds no dashboard sign-in"));
        }
        if (Status st = CheckCookieRequest(request, token); !st.ok()) co_return error(st);
      }
      request.principal = *principal;
    }
    request.params = std::move(params);
    try {
      co_return co_await route.handler(request);
    } catch (const std::exception& e) {
      co_return error(Internal(std::string("unexpected error: ") + e.what()));
    }
  }
  if (path_matched) {
    Response r = Response::Error(Status(Code::kInvalidArgument, "method " + request.method +
                                                                    " not allowed on " + request.path));
    r.status = 405;
    co_return r;
  }
  co_return Response::Error(NotFound("no route for " + request.method + " " + request.path));
}

std::vector<Router::RouteInfo> Router::Routes() const {
  std::vector<RouteInfo> out;
  out.reserve(routes_.size());
  for (const auto& r : routes_) {
    std::string pattern;
    for (const auto& segment : r.segments) pattern += "/" + segment;
    out.push_back({r.method, pattern.empty() ? "/" : pattern, r.requires_auth});
  }
  return out;
}

}  // namespace keel::http
