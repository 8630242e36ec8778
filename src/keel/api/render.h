#pragma once
// Internal to the api module: JSON shapes of the records (docs/API.md) and request helpers.

#include <initializer_list>
#include <string>
#include <string_view>

#include "keel/common/json_util.h"
#include "keel/http/types.h"
#include "keel/store/types.h"

namespace keel::store {
class Tx;
}

namespace keel::api {

Json TenantJson(const store::Tenant& t);
Json TokenJson(const store::Token& t);
Json AgentJson(const store::Agent& a);
Json SessionJson(const store::Session& s);
Json MessageJson(const store::Message& m);
Json RunJson(const store::Run& r);
Json StepJson(const store::Step& s, const store::ToolCall* call);
Json EventJson(const store::Event& e);

// The longest a session's own instructions may be (store::Session::instructions).
inline constexpr size_t kMaxSessionInstructions = 256 * 1024;

// ?limit= with validation (1..500, default 50).
Result<int> LimitOf(const http::Request& req);
// ?limit= and ?cursor= with validation (limit 1..500, default 50).
Result<store::Page> PageOf(const http::Request& req);
// PageOf with ?order=asc (the default: oldest first) or desc (newest first), for the lists that
// take it (runs, sessions).
Result<store::Page> OrderedPageOf(const http::Request& req);

template <typename T, typename Fn>
Json ListJson(const store::Paged<T>& page, Fn render) {
  Json items = Json::array();
  for (const auto& x : page.items) items.push_back(render(x));
  return {{"items", std::move(items)},
          {"next_cursor", page.next_cursor.empty() ? Json(nullptr) : Json(page.next_cursor)}};
}

// Keel's own request bodies are closed: a top-level field outside `fields` is refused, naming it
// and the fields the body takes. Open objects (an agent's config, a tool's arguments) are the
// value of one named field and are not looked into.
Status CheckFields(const Json& body, std::initializer_list<std::string_view> fields);

// Owners may administer their tenant; users may only use it.
Status RequireOwner(const http::Request& req);
// Whether the credential of a request still holds: its token (and a dashboard sign-in's own)
// neither revoked nor expired. Streams that outlive their request ask it again as they go.
Status StillAuthorized(store::Tx& tx, const http::Principal& who, Millis now);
// Owners and users, not guests; `what` names the action for the error ("see approvals").
Status RequireMember(const http::Request& req, const std::string& what);

}  // namespace keel::api
