#pragma once
// Server configuration: defaults, overridden by $KEEL_HOME/keel.toml (or --config), overridden by
// KEEL_* environment variables, overridden by command-line flags.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "keel/common/status.h"

namespace keel::config {

struct OpenAiConfig {
  std::string base_url = "https://api.openai.com/v1";
  std::string api_key;  // empty: calls fail with a clear error naming OPENAI_API_KEY
  int timeout_ms = 60000;
  int max_retries = 3;
};

struct AnthropicConfig {
  std::string base_url = "https://api.anthropic.com";
  std::string api_key;  // empty: calls fail with a clear error naming ANTHROPIC_API_KEY
  int timeout_ms = 60000;
  int max_retries = 3;
  int max_tokens = 4096;  // the Messages API requires max_tokens; an agent's config.max_tokens wins
};

// A model's price in micro-dollars per million tokens (keel.toml gives USD per million tokens:
// input_per_mtok = 0.15 is 150000 here), so a call's cost in micro-dollars is
// tokens * price / 1e6, in integers.
struct ModelPrice {
  int64_t input_microusd_per_mtok = 0;
  int64_t output_microusd_per_mtok = 0;
};

// The response cache (docs/API.md, usage, budgets and the response cache).
struct CacheConfig {
  bool enabled = true;                 // false: no agent's calls are cached
  int64_t ttl_ms = 86400000;           // an entry older than this is not used, and is pruned
  int64_t max_entries = 100000;        // beyond this, the oldest entries are pruned
  int64_t max_entry_bytes = 256 << 10; // larger responses are not cached
};

struct Config {
  std::string home;        // data directory, mode 0700
  std::string listen = "127.0.0.1:7878";
  std::string store_url;   // default sqlite://$home/keel.db
  // PostgreSQL only: the URL of the role that owns the schema; when set, the server migrates
  // (and grants the store URL's role its rights) as that role before it opens the store.
  std::string store_owner_url;
  std::string workspaces;  // default $home/workspaces
  bool durable = true;     // false: synchronous=NORMAL, not durable on power loss
  int64_t max_body_bytes = 1 << 20;
  int tenant_run_cap = 1000;     // runs queued or running per tenant before 429
  int max_concurrent_runs = 256; // runs executing at once on this node
  int max_steps = 16;            // model steps per run, unless the agent says otherwise
  int lease_ms = 30000;
  // SIGTERM drains the node (intake 503, runs handed back at their next step boundary) for at
  // most this long before it exits; a second SIGTERM or SIGINT exits at once.
  int drain_timeout_ms = 10000;
  int64_t approval_timeout_ms = 86400000;  // a pending approval expires (rejected) after this
  int64_t large_result_bytes = 16384;      // larger tool results go to the workspace
  int history_limit = 50;        // earlier messages a turn's context carries
  std::string log_level = "info";
  // Address ranges (CIDRs, or single addresses) that MCP servers over HTTP and webhook
  // receivers may reach although they are loopback, private, link-local or otherwise internal
  // (http/outbound_guard.h). keel.toml: outbound_allow = ["127.0.0.1/32"]; KEEL_OUTBOUND_ALLOW:
  // comma-separated, replacing the file's list. Empty: only public addresses.
  std::vector<std::string> outbound_allow;
  // The origins of browser pages that may call the API from another origin (CORS): exact
  // origins ("https://app.example.com") or "*". keel.toml: cors_origins = [...];
  // KEEL_CORS_ORIGINS: comma-separated, replacing the file's list. Empty: none (the default).
  std::vector<std::string> cors_origins;
  // The URL at which the internet reaches this server ("https://keel.example.com", no query),
  // for platforms that push to it (a telegram channel in webhook mode). keel.toml: public_url;
  // KEEL_PUBLIC_URL. Empty (the default): no channel may ask to be pushed to.
  std::string public_url;
  // KEEL_SECRET_KEK, or the content of the file KEEL_SECRET_KEK_FILE names (environment only):
  // base64 of the 256-bit key-encryption key of secrets.
  std::string secret_kek;
  // The unprivileged user and group that host commands and unsandboxed stdio MCP servers run
  // as (exec_uid / exec_gid, KEEL_EXEC_UID / KEEL_EXEC_GID); never Keel's own user.
  int exec_uid = 65534;
  int exec_gid = 65534;
  OpenAiConfig openai;
  AnthropicConfig anthropic;
  // Prices by model string as agents name it ("openai/gpt-4o-mini", "local"); a model without
  // a price costs nothing.
  std::map<std::string, ModelPrice> prices;
  CacheConfig cache;
};

// Flags given on the command line; unset ones do not override.
struct Overrides {
  std::optional<std::string> home;
  std::optional<std::string> config_file;
  std::optional<std::string> listen;
  std::optional<std::string> store_url;
};

// The default data directory: $KEEL_HOME, else ~/.local/share/keel.
std::string DefaultHome();

// Loads and validates the configuration. Errors name the setting and its source.
Result<Config> Load(const Overrides& overrides);

// Removes KEEL_SECRET_KEK from this process's environment and overwrites its bytes where the
// kernel shows them (/proc/PID/environ), so that nothing reading the environment later finds
// the key. REQUIRES: no other thread reads the environment meanwhile (call at start).
void ForgetSecretKekInEnvironment();

}  // namespace keel::config
