#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "keel/common/time.h"
#include "keel/tools/tool.h"
#include "keel/tools/workspace.h"

namespace keel::tools {

const char* EffectClassName(EffectClass c) {
  switch (c) {
    case EffectClass::kPure: return "pure";
    case EffectClass::kIdempotent: return "idempotent";
    case EffectClass::kOnce: return "once";
  }
  return "once";
}

boost::asio::awaitable<Result<Json>> Tool::ExecuteOnLoop(const ToolContext& ctx, Json arguments) {
  co_return Execute(ctx, arguments);
}

Status ToolRegistry::Register(std::unique_ptr<Tool> tool) {
  std::string name = tool->name();
  if (!tools_.emplace(name, std::move(tool)).second) {
    return InvalidArgument("tool registered twice: " + name);
  }
  return Status::Ok();
}

Tool* ToolRegistry::Find(const std::string& name) const {
  auto it = tools_.find(name);
  return it == tools_.end() ? nullptr : it->second.get();
}

std::vector<const Tool*> ToolRegistry::All() const {
  std::vector<const Tool*> out;
  for (const auto& [name, tool] : tools_) out.push_back(tool.get());
  return out;
}

namespace {

class TimeNow final : public Tool {
 public:
  std::string name() const override { return "time.now"; }
  std::string description() const override { return "The current UTC time (RFC 3339)."; }
  Json parameters() const override {
    return {{"type", "object"}, {"properties", Json::object()}, {"additionalProperties", false}};
  }
  EffectClass effect_class() const override { return EffectClass::kPure; }
  std::vector<std::string> rights() const override { return {"read"}; }
  Result<Json> Execute(const ToolContext&, const Json&) override {
    return Json(FormatRfc3339(NowMillis()));
  }
};

class NotesAppend final : public Tool {
 public:
  std::string name() const override { return "notes.append"; }
  std::string description() const override {
    return "Appends one line to notes.txt in the agent's workspace.";
  }
  Json parameters() const override {
    return {{"type", "object"},
            {"properties", {{"line", {{"type", "string"}, {"description", "the line to append"}}}}},
            {"required", {"line"}},
            {"additionalProperties", false}};
  }
  EffectClass effect_class() const override { return EffectClass::kOnce; }
  std::vector<std::string> rights() const override { return {"write"}; }
  Result<Json> Execute(const ToolContext& ctx, const Json& args) override {
    if (!args.is_object() || !args.contains("line") || !args["line"].is_string()) {
      return InvalidArgument("notes.append needs {\"line\": TEXT}");
    }
    std::string line = args["line"].get<std::string>();
    if (line.find('\n') != std::string::npos) {
      return InvalidArgument("notes.append takes one line (no newline characters)");
    }
    if (line.size() > 4096) return InvalidArgument("notes.append: line longer than 4096 bytes");
    // Inside the workspace and not through a symlink (a command may have planted one).
    KEEL_ASSIGN_OR_RETURN(std::string path, ResolveInWorkspace(ctx.workspace, "notes.txt"));
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return Unavailable("cannot open " + path + ": " + std::strerror(errno));
    std::string data = line + "\n";
    // One write(2) with O_APPEND: the line lands whole or not at all on a local file system.
    ssize_t n = ::write(fd, data.data(), data.size());
    int err = errno;
    if (n == static_cast<ssize_t>(data.size())) ::fdatasync(fd);
    ::close(fd);
    if (n != static_cast<ssize_t>(data.size())) {
      return Unavailable("cannot append to " + path + ": " + std::strerror(err));
    }
    return Json{{"appended", line}};
  }
};

}  // namespace

Status RegisterBuiltinTools(ToolRegistry& registry) {
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<TimeNow>()));
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<NotesAppend>()));
  return Status::Ok();
}

}  // namespace keel::tools
