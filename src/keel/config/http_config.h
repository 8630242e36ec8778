#pragma once
// The HTTP server's connection settings: read from the same keel.toml and KEEL_* variables as
// Config, with the same precedence (defaults, then the file, then the environment). Each
// connection holds a descriptor; SSE and WebSocket streams count while they are open.

#include <cstdint>

#include "keel/common/status.h"
#include "keel/config/config.h"

namespace keel::config {

struct HttpConfig {
  int max_connections = 1024;             // open at once; more are answered 503 and closed
  int max_connections_per_address = 256;  // the same, from one client IP address
  int64_t header_timeout_ms = 10000;      // a request's head must arrive within this
  int64_t body_timeout_ms = 30000;        // a request's body, within this after its head
  int64_t idle_timeout_ms = 30000;        // a kept-alive connection idle this long is closed
};

// Fails as Load(overrides) does: both check the whole file and environment.
Result<HttpConfig> LoadHttp(const Overrides& overrides);

}  // namespace keel::config
