#pragma once
// The tools of introspection runs (docs/CONTEXT.md): introspection.set_description (the
// session's description) and introspection.set_working_memory (the agent's working memory,
// memory::PutWorkingMemory).
// They act only inside an introspection run of the session (its message has the role
// `introspection`), and the runtime offers them only there. They write the store from the
// gateway's tool pool, each change with its event in one unit of work.

#include "keel/common/status.h"

namespace keel::store {
class Store;
}

namespace keel::tools {

class ToolRegistry;

inline constexpr size_t kMaxDescriptionBytes = 1000;

Status RegisterIntrospectionTools(ToolRegistry& registry, store::Store& store);

}  // namespace keel::tools
