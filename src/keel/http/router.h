#pragma once
// Router: maps (method, path pattern) to a handler. Patterns are literal segments and {name}
// placeholders ("/v1/agents/{id}/sessions"). Authentication runs before any handler of a
// route that requires it.

#include <boost/asio/awaitable.hpp>

#include <functional>
#include <string>
#include <vector>

#include "keel/http/types.h"

namespace keel::http {

using Handler = std::function<boost::asio::awaitable<Response>(Request&)>;
// Resolves the bearer token into a principal for the request (its route's params are set);
// kUnauthenticated when missing or invalid.
using Authenticator = std::function<boost::asio::awaitable<Result<Principal>>(
    std::string bearer_token, const Request& request)>;
// Renders a failure the router finds for a route (no token, a bad one, a handler that threw) in
// the shape that route's clients read; Keel's own (Response::Error) when a route gives none.
using ErrorRenderer = Response (*)(const Status& status);

class Router {
 public:
  explicit Router(Authenticator authenticate) : authenticate_(std::move(authenticate)) {}

  // REQUIRES: no route with the same method and pattern exists.
  void Add(const std::string& method, const std::string& pattern, Handler handler,
           bool requires_auth = true, ErrorRenderer render_error = nullptr);

  // Finds the route, authenticates, runs the handler. 404 for unknown paths, 405 for a known
  // path with another method, 401 without a valid token. Handler exceptions become 500.
  boost::asio::awaitable<Response> Dispatch(Request& request) const;

  struct RouteInfo {
    std::string method;
    std::string pattern;  // as given to Add
    bool requires_auth;
  };
  // Every route, in the order added (the hostile-tenant matrix test walks them all).
  std::vector<RouteInfo> Routes() const;

 private:
  struct Route {
    std::string method;
    std::vector<std::string> segments;
    Handler handler;
    bool requires_auth;
    ErrorRenderer render_error;
  };
  Authenticator authenticate_;
  std::vector<Route> routes_;
};

}  // namespace keel::http
