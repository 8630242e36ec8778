#pragma once
// The v1 HTTP API: each api_*.cc registers the routes of one resource on the Router. Handlers
// validate input, call the store or the runtime, and render JSON in the shapes of docs/API.md.

#include <string>

#include "keel/http/router.h"

namespace keel {
struct Metrics;
namespace config {
struct Config;
}
namespace model {
class ProviderRegistry;
}
namespace store {
class Store;
}
namespace secrets {
class Vault;
}
namespace tools {
class Gateway;
}
namespace mcp {
class McpManager;
}
namespace runtime {
class Runtime;
class EventHub;
}  // namespace runtime
namespace channels {
class Relay;
}
}  // namespace keel

namespace keel::api {

// What handlers need; owned by the server instance and outliving the router.
struct ApiContext {
  store::Store& store;
  runtime::Runtime& runtime;
  runtime::EventHub& hub;
  Metrics& metrics;
  const config::Config& config;
  const model::ProviderRegistry& providers;
  const secrets::Vault& vault;
  tools::Gateway& gateway;
  mcp::McpManager& mcp;
  std::string admin_tenant_id;  // the first tenant: its owners are platform admins
  // Chat platforms' bots (channels/relay.h): updates Telegram posts to POST /v1/hooks/{id}.
  channels::Relay* relay = nullptr;
};

// A client's Idempotency-Key: at most what intake takes, and not in the "webhook:",
// "telegram:", "slack:" or "discord:" namespaces,
// which a channel's deliveries use (a client could otherwise take a delivery's key first and
// so have the delivery answered as a replay of its own message). kInvalidArgument.
Status CheckClientIdempotencyKey(const std::string& key);

// Intake's refusal of a message as an answer: with Retry-After for the refusals a client may
// retry (too many runs in flight, the store unavailable).
http::Response IntakeError(const Status& st);

// Resolves bearer tokens against the store (sha256 lookup).
http::Authenticator MakeAuthenticator(ApiContext& ctx);

void RegisterAllRoutes(http::Router& router, ApiContext& ctx);

// Per-resource registration (one file each).
void RegisterHealthRoutes(http::Router& router, ApiContext& ctx);
void RegisterAdminRoutes(http::Router& router, ApiContext& ctx);     // tenants, tokens
void RegisterAgentRoutes(http::Router& router, ApiContext& ctx);     // agents
void RegisterSessionRoutes(http::Router& router, ApiContext& ctx);   // sessions, messages
void RegisterRunRoutes(http::Router& router, ApiContext& ctx);       // runs, steps, cancel
void RegisterEventRoutes(http::Router& router, ApiContext& ctx);     // events, SSE stream
void RegisterSecretRoutes(http::Router& router, ApiContext& ctx);    // secrets
void RegisterPolicyRoutes(http::Router& router, ApiContext& ctx);    // policies, emergency stops
void RegisterApprovalRoutes(http::Router& router, ApiContext& ctx);  // approvals, standing ones
void RegisterMcpRoutes(http::Router& router, ApiContext& ctx);       // MCP servers
void RegisterMcpServerRoutes(http::Router& router, ApiContext& ctx); // /v1/mcp: Keel as one
void RegisterPluginRoutes(http::Router& router, ApiContext& ctx);    // plugins, deliveries
void RegisterScheduleRoutes(http::Router& router, ApiContext& ctx);  // schedules
void RegisterUsageRoutes(http::Router& router, ApiContext& ctx);     // usage, budgets
void RegisterMemoryRoutes(http::Router& router, ApiContext& ctx);    // memories, working memory
void RegisterSkillRoutes(http::Router& router, ApiContext& ctx);     // skills, assignments
void RegisterChannelRoutes(http::Router& router, ApiContext& ctx);   // channels, webhook ingress
void RegisterUserRoutes(http::Router& router, ApiContext& ctx);      // users, members, access
void RegisterContextRoutes(http::Router& router, ApiContext& ctx);   // compactions
void RegisterOpenAiRoutes(http::Router& router, ApiContext& ctx);    // /v1/chat/completions
void RegisterDashboardRoutes(http::Router& router, ApiContext& ctx);  // /, sign-in

// The OpenAPI 3.1 document served at /v1/openapi.json.
const std::string& OpenApiDocument();

}  // namespace keel::api
