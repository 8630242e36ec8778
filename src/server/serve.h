#pragma once
// `keel serve`: wires the store, runtime, gateway, providers and HTTP server together.

#include <optional>
#include <string>

namespace keel::server {

struct ServeFlags {
  std::optional<std::string> home, config_file, listen, store_url;
  bool demo = false;  // create a demo agent on the local model when absent
  bool print_routes = false;  // print "METHOD PATTERN auth|public" per route and exit
};

// Runs the server until SIGTERM/SIGINT. Returns the process exit code.
int ServeMain(const ServeFlags& flags);

}  // namespace keel::server
