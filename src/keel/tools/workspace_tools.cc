// Tools that work in the agent's workspace: files.read, files.write, files.list, and exec (a
// command in a bubblewrap sandbox, or on the host for agents whose owner allows it). Every path
// is resolved inside the workspace; one that escapes it (`..`, an absolute path, a symlink
// pointing out) is refused.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "keel/common/ids.h"
#include "keel/tools/process.h"
#include "keel/tools/tool.h"
#include "keel/tools/workspace.h"

namespace keel::tools {

namespace fs = std::filesystem;

Result<std::string> ResolveInWorkspace(const std::string& workspace, const std::string& path) {
  if (path.empty()) return InvalidArgument("path must not be empty");
  if (path.find('\0') != std::string::npos) return InvalidArgument("path contains a NUL byte");
  fs::path rel(path);
  if (rel.is_absolute()) {
    return InvalidArgument("path '" + path + "' is absolute; paths are relative to the workspace");
  }
  fs::path norm = rel.lexically_normal();
  if (!norm.empty() && *norm.begin() == "..") {
    return PermissionDenied("path '" + path + "' leaves the workspace");
  }
  std::error_code ec;
  fs::create_directories(workspace, ec);
  if (ec) return Unavailable("cannot create the workspace: " + ec.message());
  fs::path root = fs::weakly_canonical(workspace, ec);
  if (ec) return Unavailable("cannot resolve the workspace: " + ec.message());
  // Symlinks in the existing part of the path are followed here, so one that points out of the
  // workspace is caught.
  fs::path target = fs::weakly_canonical(root / norm, ec);
  if (ec) return Unavailable("cannot resolve '" + path + "': " + ec.message());
  std::string r = root.string(), t = target.string();
  if (t != r && t.compare(0, r.size() + 1, r + "/") != 0) {
    return PermissionDenied("path '" + path + "' leaves the workspace");
  }
  return t;
}

namespace {

constexpr size_t kMaxReadBytes = 1 << 20;
constexpr size_t kMaxWriteBytes = 8 << 20;
constexpr size_t kMaxListEntries = 1000;

Result<std::string> StringArg(const Json& args, const char* name) {
  if (!args.contains(name) || !args[name].is_string()) {
    return InvalidArgument(std::string("'") + name + "' must be a string");
  }
  return args[name].get<std::string>();
}

class FilesRead final : public Tool {
 public:
  std::string name() const override { return "files.read"; }
  std::string description() const override {
    return "Reads a text file of the agent's workspace: up to 1 MiB from `offset` (bytes), or "
           "`length` bytes.";
  }
  Json parameters() const override {
    return {{"type", "object"},
            {"properties",
             {{"path", {{"type", "string"}, {"description", "relative to the workspace"}}},
              {"offset", {{"type", "integer"}, {"minimum", 0}}},
              {"length", {{"type", "integer"}, {"minimum", 1}, {"maximum", 1 << 20}}}}},
            {"required", {"path"}},
            {"additionalProperties", false}};
  }
  EffectClass effect_class() const override { return EffectClass::kPure; }
  std::vector<std::string> rights() const override { return {"read"}; }
  Result<Json> Execute(const ToolContext& ctx, const Json& args) override {
    KEEL_ASSIGN_OR_RETURN(std::string path, StringArg(args, "path"));
    KEEL_ASSIGN_OR_RETURN(std::string full, ResolveInWorkspace(ctx.workspace, path));
    int fd = ::open(full.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      if (errno == ENOENT) return NotFound("no file '" + path + "' in the workspace");
      return InvalidArgument("cannot read '" + path + "': " + std::strerror(errno));
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      return InvalidArgument("'" + path + "' is not a regular file");
    }
    const size_t size = static_cast<size_t>(st.st_size);
    const size_t offset = std::min<size_t>(args.value("offset", size_t(0)), size);
    const size_t want = std::min<size_t>(args.value("length", kMaxReadBytes), kMaxReadBytes);
    std::string data(std::min(want, size - offset), '\0');
    ssize_t n = ::pread(fd, data.data(), data.size(), static_cast<off_t>(offset));
    ::close(fd);
    if (n < 0) return Unavailable("cannot read '" + path + "': " + std::strerror(errno));
    data.resize(static_cast<size_t>(n));
    Json out = {{"path", path}, {"content", data}, {"bytes", size}};
    if (offset > 0) out["offset"] = offset;
    if (offset + data.size() < size) out["truncated"] = true;
    return out;
  }
};

class FilesWrite final : public Tool {
 public:
  std::string name() const override { return "files.write"; }
  std::string description() const override {
    return "Writes a text file in the agent's workspace, replacing it whole (creates directories).";
  }
  Json parameters() const override {
    return {{"type", "object"},
            {"properties",
             {{"path", {{"type", "string"}, {"description", "relative to the workspace"}}},
              {"content", {{"type", "string"}}}}},
            {"required", {"path", "content"}},
            {"additionalProperties", false}};
  }
  // Writing the same content again leaves the same file.
  EffectClass effect_class() const override { return EffectClass::kIdempotent; }
  std::vector<std::string> rights() const override { return {"write"}; }
  Result<Json> Execute(const ToolContext& ctx, const Json& args) override {
    KEEL_ASSIGN_OR_RETURN(std::string path, StringArg(args, "path"));
    KEEL_ASSIGN_OR_RETURN(std::string content, StringArg(args, "content"));
    if (content.size() > kMaxWriteBytes) return InvalidArgument("content is larger than 8 MiB");
    KEEL_ASSIGN_OR_RETURN(std::string full, ResolveInWorkspace(ctx.workspace, path));
    fs::path target(full);
    std::error_code ec;
    fs::create_directories(target.parent_path(), ec);
    if (ec) return InvalidArgument("cannot create the directory of '" + path + "': " + ec.message());
    // Re-checked after creating directories: nothing on the way may lead out.
    KEEL_ASSIGN_OR_RETURN(std::string again, ResolveInWorkspace(ctx.workspace, path));
    if (again != full) return PermissionDenied("path '" + path + "' leaves the workspace");
    if (fs::is_symlink(target, ec)) return PermissionDenied("'" + path + "' is a symbolic link");
    std::string tmp = full + ".keel-tmp-" + NewId();
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) return Unavailable("cannot write '" + path + "': " + std::strerror(errno));
    ssize_t n = ::write(fd, content.data(), content.size());
    bool ok = n == static_cast<ssize_t>(content.size()) && ::fdatasync(fd) == 0;
    ::close(fd);
    if (!ok || ::rename(tmp.c_str(), full.c_str()) != 0) {
      ::unlink(tmp.c_str());
      return Unavailable("cannot write '" + path + "': " + std::strerror(errno));
    }
    return Json{{"path", path}, {"bytes", content.size()}};
  }
};

class FilesList final : public Tool {
 public:
  std::string name() const override { return "files.list"; }
  std::string description() const override {
    return "Lists a directory of the agent's workspace (default: its top).";
  }
  Json parameters() const override {
    return {{"type", "object"},
            {"properties", {{"path", {{"type", "string"}, {"description", "relative to the workspace"}}}}},
            {"additionalProperties", false}};
  }
  EffectClass effect_class() const override { return EffectClass::kPure; }
  std::vector<std::string> rights() const override { return {"read"}; }
  Result<Json> Execute(const ToolContext& ctx, const Json& args) override {
    std::string path = args.value("path", std::string("."));
    KEEL_ASSIGN_OR_RETURN(std::string full, ResolveInWorkspace(ctx.workspace, path));
    std::error_code ec;
    if (!fs::is_directory(full, ec)) return NotFound("no directory '" + path + "' in the workspace");
    std::vector<Json> entries;
    bool truncated = false;
    for (const auto& e : fs::directory_iterator(full, ec)) {
      if (entries.size() >= kMaxListEntries) {
        truncated = true;
        break;
      }
      std::string name = e.path().filename().string();
      if (name.find(".keel-tmp-") != std::string::npos) continue;
      std::error_code ec2;
      auto status = e.symlink_status(ec2);
      std::string type = fs::is_symlink(status)     ? "link"
                         : fs::is_directory(status) ? "dir"
                         : fs::is_regular_file(status) ? "file"
                                                       : "other";
      Json entry = {{"name", name}, {"type", type}};
      if (type == "file") entry["size"] = e.file_size(ec2);
      entries.push_back(std::move(entry));
    }
    if (ec) return Unavailable("cannot list '" + path + "': " + ec.message());
    std::sort(entries.begin(), entries.end(),
              [](const Json& a, const Json& b) { return a["name"] < b["name"]; });
    Json out = {{"path", path}, {"entries", entries}};
    if (truncated) out["truncated"] = true;
    return out;
  }
};

class Exec final : public Tool {
 public:
  std::string name() const override { return "exec"; }
  std::string description() const override {
    return "Runs a shell command in the agent's workspace, in a sandbox without network: the "
           "system is read-only, only the workspace is writable. Returns exit code and output.";
  }
  Json parameters() const override {
    return {{"type", "object"},
            {"properties",
             {{"command", {{"type", "string"}, {"description", "run with /bin/sh -c"}, {"minLength", 1}}},
              {"stdin", {{"type", "string"}}},
              {"timeout_s", {{"type", "integer"}, {"minimum", 1}, {"maximum", 300}}}}},
            {"required", {"command"}},
            {"additionalProperties", false}};
  }
  EffectClass effect_class() const override { return EffectClass::kOnce; }
  std::vector<std::string> rights() const override { return {"write"}; }
  bool blocking() const override { return true; }
  Result<Json> Execute(const ToolContext& ctx, const Json& args) override {
    KEEL_ASSIGN_OR_RETURN(std::string command, StringArg(args, "command"));
    std::string input = args.value("stdin", std::string());
    ProcessLimits limits;
    limits.timeout_ms = args.value("timeout_s", 30) * int64_t(1000);
    std::error_code ec;
    fs::create_directories(ctx.workspace, ec);
    if (ec) return Unavailable("cannot create the workspace: " + ec.message());
    std::string backend = "sandbox";
    if (ctx.agent_config.is_object() && ctx.agent_config.contains("exec_backend") &&
        ctx.agent_config["exec_backend"].is_string()) {
      backend = ctx.agent_config["exec_backend"].get<std::string>();
    }
    std::vector<std::string> argv;
    std::vector<std::string> env = {"PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"};
    std::string cwd;
    if (backend == "host") {
      argv = {"/bin/sh", "-c", command};
      env.push_back("HOME=" + ctx.workspace);
      cwd = ctx.workspace;
    } else {
      KEEL_ASSIGN_OR_RETURN(argv, SandboxArgv(ctx.workspace, command));
    }
    KEEL_ASSIGN_OR_RETURN(ProcessResult r, RunProcess(argv, env, cwd, input, limits));
    if (r.timed_out) {
      return Unavailable("the command did not finish within " +
                         std::to_string(limits.timeout_ms / 1000) + " s and was killed");
    }
    if (r.flooded) {
      return Unavailable("the command wrote more than " + std::to_string(limits.flood_bytes >> 20) +
                         " MiB of output and was killed");
    }
    Json out = {{"exit_code", r.exit_code}, {"stdout", r.stdout_text}, {"stderr", r.stderr_text},
                {"elapsed_ms", r.elapsed_ms}};
    if (r.signal) out["signal"] = r.signal;
    if (r.truncated) out["truncated"] = true;
    return out;
  }
};

}  // namespace

Result<std::vector<std::string>> SandboxArgv(const std::string& workspace,
                                             const std::string& command) {
  static const char* kBwrapPaths[] = {"/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap"};
  std::string bwrap;
  for (const char* p : kBwrapPaths) {
    if (::access(p, X_OK) == 0) {
      bwrap = p;
      break;
    }
  }
  if (bwrap.empty()) {
    return Unavailable("the exec sandbox needs bubblewrap (bwrap), which is not installed "
                       "(apt-get install bubblewrap); commands do not run without it");
  }
  std::vector<std::string> a = {bwrap,          "--die-with-parent", "--new-session",
                                "--unshare-all", "--cap-drop",        "ALL",
                                "--uid",         "65534",             "--gid",
                                "65534",         "--hostname",        "keel-sandbox",
                                "--ro-bind",     "/usr",              "/usr"};
  // Merged-/usr systems have /bin, /lib... as symlinks into /usr; others get them bound.
  for (const char* dir : {"/bin", "/sbin", "/lib", "/lib64", "/lib32"}) {
    std::error_code ec;
    if (fs::is_symlink(dir, ec)) {
      a.insert(a.end(), {"--symlink", fs::read_symlink(dir, ec).string(), dir});
    } else if (fs::is_directory(dir, ec)) {
      a.insert(a.end(), {"--ro-bind", dir, dir});
    }
  }
  a.insert(a.end(), {"--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
                     "--ro-bind-try", "/etc/alternatives", "/etc/alternatives",
                     "--proc",        "/proc",
                     "--dev",         "/dev",
                     "--tmpfs",       "/tmp",
                     "--bind",        workspace,           "/workspace",
                     "--chdir",       "/workspace",
                     "--clearenv",
                     "--setenv",      "PATH",              "/usr/local/bin:/usr/bin:/bin",
                     "--setenv",      "HOME",              "/workspace",
                     "--setenv",      "LANG",              "C.UTF-8",
                     "--",            "/bin/sh",           "-c",
                     command});
  return a;
}

Status RegisterWorkspaceTools(ToolRegistry& registry) {
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<FilesRead>()));
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<FilesWrite>()));
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<FilesList>()));
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<Exec>()));
  return Status::Ok();
}

}  // namespace keel::tools
