#pragma once
// The event catalog: the hook points of an agent's life, each a named, versioned type with one
// hook shape. A type's payload never changes; a new shape is a new version (`tool.after@v2`),
// dispatched side by side with the old one: the runtime emits the newest, and handlers of an
// older version get it converted down (docs/PLUGINS.md has the payloads).

#include <string>
#include <string_view>
#include <vector>

#include "keel/common/json_util.h"

namespace keel::plugins {

enum class Shape {
  kListener,   // sees the payload; returns nothing
  kTransform,  // returns the payload, possibly changed, for the next handler and the runtime
  kVeto,       // returns allow or deny with a reason; the first deny wins
};

const char* ShapeName(Shape shape);

struct EventType {
  std::string family;  // "tool.after"
  int version = 1;
  Shape shape = Shape::kListener;
  // Off the hot path: a webhook plugin may subscribe to it.
  bool webhook = false;
  // Down-converts a payload of the next version to this one (null for the newest).
  Json (*from_next)(const Json& next) = nullptr;

  std::string Name() const { return family + "@v" + std::to_string(version); }
};

// Every type, grouped by family, versions ascending.
const std::vector<EventType>& Catalog();

// The type named "family@vN", or nullptr.
const EventType* FindEvent(std::string_view name);

// The newest version of a family, or 0 when the family is unknown.
int NewestVersion(std::string_view family);

// The payload of `family@vN`, converted down from the newest version's payload.
// REQUIRES: 1 <= version <= NewestVersion(family).
Json ConvertDown(std::string_view family, int version, Json newest);

}  // namespace keel::plugins
