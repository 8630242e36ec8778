#pragma once
// Plain HTTP request/response values. Handlers see these, never Beast types, so the API
// modules compile without Beast's headers.

#include <boost/asio/awaitable.hpp>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "keel/common/json_util.h"
#include "keel/common/status.h"

namespace keel::http {

// Who is calling, resolved from the bearer token (or a dashboard sign-in's cookie) before the
// handler runs.
struct Principal {
  std::string tenant_id;
  std::string token_id;  // a dashboard sign-in acts as the token that signed in
  // owner | user | guest: for a token of a user, on the agent the request concerns, the
  // lower of its own role and its user's there (access/users.h); on the tenant's other routes
  // at most guest.
  std::string role;
  std::string user_id;  // the user the token belongs to, "" for a token of the tenant
  bool platform_admin = false;
  // The dashboard sign-in's own token id when the credential is one (a cookie or its secret),
  // else "".
  std::string browser_session_id;
};

struct Request {
  std::string method;
  std::string path;    // without the query string
  std::map<std::string, std::string> query;   // decoded
  std::map<std::string, std::string> headers; // lower-cased names
  std::map<std::string, std::string> params;  // from the route pattern, e.g. {id}
  std::string body;
  Principal principal;

  std::string Header(const std::string& lower_name) const;
  // A GET asking to become a WebSocket (RFC 6455: Connection: Upgrade, Upgrade: websocket).
  bool IsWebSocketUpgrade() const;
  std::string Param(const std::string& name) const;
  // The query parameter, or `fallback` when absent.
  std::string Query(const std::string& name, const std::string& fallback = "") const;
};

// Writes a long-lived stream: the body of a Server-Sent Events response, or the text messages
// of a WebSocket (one Write, one message). Write and Ping return false once the client has gone
// away.
class StreamWriter {
 public:
  virtual ~StreamWriter() = default;
  virtual boost::asio::awaitable<bool> Write(std::string data) = 0;
  // Shows the client the stream is alive while nothing happens: an SSE comment line, a
  // WebSocket ping.
  virtual boost::asio::awaitable<bool> Ping() = 0;
  // The stream ends because the server stops: a WebSocket then closes with 1012 (service
  // restart), which tells its client to connect again; an SSE client reconnects by itself.
  virtual void EndForRestart() {}
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::map<std::string, std::string> headers;
  // When set, the server sends the headers, then hands the connection to `stream`, and closes
  // it when `stream` returns. For a WebSocket upgrade request (IsWebSocketUpgrade), the server
  // completes the handshake instead of sending headers; a route that streams over a WebSocket
  // checks the request itself.
  std::function<boost::asio::awaitable<void>(StreamWriter&)> stream;

  static Response Json(int status, const keel::Json& body);
  static Response Error(const Status& status);
  static Response NoContent();
};

}  // namespace keel::http
