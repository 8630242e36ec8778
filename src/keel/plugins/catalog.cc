#include "keel/plugins/catalog.h"

#include <map>

namespace keel::plugins {

namespace {

// tool.after@v2 added how long the call took, its effect class and the gateway's decision;
// v1 is the same payload without them.
Json ToolAfterV1(const Json& v2) {
  Json v1 = v2;
  v1.erase("duration_ms");
  v1.erase("effect_class");
  v1.erase("decision");
  return v1;
}

std::vector<EventType> Build() {
  using S = Shape;
  return {
      {"agent.started", 1, S::kListener, true},
      {"agent.stopped", 1, S::kListener, true},
      {"session.opened", 1, S::kListener, true},
      {"session.closed", 1, S::kListener, true},
      {"session.message.received", 1, S::kTransform, false},
      {"prompt.assemble", 1, S::kTransform, false},
      {"model.before", 1, S::kTransform, false},
      {"model.after", 1, S::kListener, true},
      {"tool.before", 1, S::kVeto, false},
      {"tool.after", 1, S::kListener, true, ToolAfterV1},
      {"tool.after", 2, S::kListener, true},
      {"channel.message.in", 1, S::kTransform, false},
      {"channel.message.out", 1, S::kTransform, false},
      {"schedule.fired", 1, S::kTransform, true},
      {"memory.upsert", 1, S::kListener, true},
      {"plugin.error", 1, S::kListener, true},
  };
}

}  // namespace

const char* ShapeName(Shape shape) {
  switch (shape) {
    case Shape::kListener: return "listener";
    case Shape::kTransform: return "transform";
    case Shape::kVeto: return "veto";
  }
  return "?";
}

const std::vector<EventType>& Catalog() {
  static const std::vector<EventType> catalog = Build();
  return catalog;
}

const EventType* FindEvent(std::string_view name) {
  for (const auto& e : Catalog()) {
    if (e.Name() == name) return &e;
  }
  return nullptr;
}

int NewestVersion(std::string_view family) {
  int newest = 0;
  for (const auto& e : Catalog()) {
    if (e.family == family) newest = std::max(newest, e.version);
  }
  return newest;
}

Json ConvertDown(std::string_view family, int version, Json newest) {
  for (int v = NewestVersion(family) - 1; v >= version; --v) {
    for (const auto& e : Catalog()) {
      if (e.family == family && e.version == v && e.from_next) newest = e.from_next(newest);
    }
  }
  return newest;
}

}  // namespace keel::plugins
