// Tools that work in the agent's workspace: files.read, files.write, files.list, and exec (a
// command in a bubblewrap sandbox, or on the host as the exec user for agents of a tenant the
// platform admin allowed it). Every path
// is resolved inside the workspace; one that escapes it (`..`, an absolute path, a symlink
// pointing out) is refused.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

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

// A workspace handed to the exec user (host execution) stays its: what files.write creates in
// it (the file, through `fd`, and the directories from `dir` up) becomes that user's too, so
// its commands can read them. Only root can, and needs to.
void GiveToWorkspaceOwner(const std::string& workspace, int fd, fs::path dir) {
  struct stat ws {};
  if (::geteuid() != 0 || ::stat(workspace.c_str(), &ws) != 0 || ws.st_uid == 0) return;
  (void)!::fchown(fd, ws.st_uid, ws.st_gid);
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(workspace, ec);
  for (; !ec && dir != root && dir.string().size() > root.string().size();
       dir = dir.parent_path()) {
    struct stat st {};
    if (::lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == 0) {
      (void)!::lchown(dir.c_str(), ws.st_uid, ws.st_gid);
    }
  }
}

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
    GiveToWorkspaceOwner(ctx.workspace, fd, fs::path(full).parent_path());
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
  explicit Exec(ExecOptions options) : options_(std::move(options)) {}
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
      // The host is the platform admin's to grant, and even then it is reached as the exec
      // user, never as Keel's own (which could read Keel's memory, keys and tokens).
      const Json& config = ctx.agent_config;
      if (!config.is_object() || config.value(kHostExecGranted, false) != true) {
        return PermissionDenied("host execution is not allowed in this tenant (only the platform "
                                "admin can allow it: PATCH /v1/tenants/{id} allow_host_exec)");
      }
      if (Status can = CanRunAs(options_.uid, options_.gid); !can.ok()) {
        return Status(can.code(), "host execution refused: " + can.message());
      }
      KEEL_RETURN_IF_ERROR(HandOver(ctx.workspace));
      argv = {"/bin/sh", "-c", command};
      env.push_back("HOME=" + ctx.workspace);
      cwd = ctx.workspace;
      limits.run_as_uid = options_.uid;
      limits.run_as_gid = options_.gid;
    } else {
      KEEL_ASSIGN_OR_RETURN(argv, SandboxArgv(ctx.workspace, command, options_.hidden));
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

 private:
  // The exec user works in the workspace (only there: its parents stay Keel's). The first
  // time, what is in it becomes the exec user's too; files.write keeps it so.
  Status HandOver(const std::string& workspace) const {
    struct stat st {};
    if (::stat(workspace.c_str(), &st) != 0) {
      return Unavailable(std::string("cannot read the workspace: ") + std::strerror(errno));
    }
    if (st.st_uid == static_cast<uid_t>(options_.uid)) return Status::Ok();
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(workspace, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      (void)!::lchown(it->path().c_str(), options_.uid, options_.gid);
    }
    if (::chown(workspace.c_str(), options_.uid, options_.gid) != 0) {
      return Unavailable(std::string("cannot hand the workspace to the exec user: ") +
                         std::strerror(errno));
    }
    return Status::Ok();
  }

  const ExecOptions options_;
};

// Whether `path` is `dir` or lies below it (both canonical).
bool Within(const std::string& path, const std::string& dir) {
  if (dir == "/") return true;
  return path == dir || (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
                         path[dir.size()] == '/');
}

std::string Canonical(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::weakly_canonical(path, ec);
  return ec ? path : p.string();
}

// The effective capabilities of this process (CapEff of /proc/self/status); 0 when unreadable.
uint64_t EffectiveCapabilities() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      try {
        return std::stoull(line.substr(7), nullptr, 16);
      } catch (...) {
        return 0;
      }
    }
  }
  return 0;
}

}  // namespace

Status CanRunAs(int uid, int gid) {
  if (uid < 0 || gid < 0) return Unavailable("no exec user is configured (exec_uid, exec_gid)");
  if (static_cast<uid_t>(uid) == ::geteuid() || uid == 0) {
    return Unavailable("the exec user (uid " + std::to_string(uid) + ") must not be root or "
                       "Keel's own user; set exec_uid to an unprivileged user");
  }
  constexpr uint64_t kSetGid = uint64_t(1) << 6, kSetUid = uint64_t(1) << 7;
  if (::geteuid() != 0 && (EffectiveCapabilities() & (kSetGid | kSetUid)) != (kSetGid | kSetUid)) {
    return Unavailable("Keel runs as uid " + std::to_string(::geteuid()) + " without "
                       "CAP_SETUID/CAP_SETGID, so it cannot start commands as the exec user (uid " +
                       std::to_string(uid) + "); it does not run them as its own user instead");
  }
  return Status::Ok();
}

Result<std::vector<std::string>> SandboxArgv(const SandboxSpec& spec) {
  static const char* kBwrapPaths[] = {"/usr/bin/bwrap", "/bin/bwrap", "/usr/local/bin/bwrap"};
  std::string bwrap;
  for (const char* p : kBwrapPaths) {
    if (::access(p, X_OK) == 0) {
      bwrap = p;
      break;
    }
  }
  if (bwrap.empty()) {
    return Unavailable("the sandbox needs bubblewrap (bwrap), which is not installed "
                       "(apt-get install bubblewrap); commands do not run without it");
  }
  if (spec.argv.empty()) return InvalidArgument("no command to run in the sandbox");
  std::vector<std::string> a = {bwrap,          "--die-with-parent", "--new-session",
                                "--unshare-all", "--cap-drop",        "ALL",
                                "--uid",         "65534",             "--gid",
                                "65534",         "--hostname",        "keel-sandbox",
                                "--ro-bind",     "/usr",              "/usr"};
  std::vector<std::string> bound = {"/usr"};
  // Merged-/usr systems have /bin, /lib... as symlinks into /usr; others get them bound.
  for (const char* dir : {"/bin", "/sbin", "/lib", "/lib64", "/lib32"}) {
    std::error_code ec;
    if (fs::is_symlink(dir, ec)) {
      a.insert(a.end(), {"--symlink", fs::read_symlink(dir, ec).string(), dir});
    } else if (fs::is_directory(dir, ec)) {
      a.insert(a.end(), {"--ro-bind", dir, dir});
      bound.push_back(dir);
    }
  }
  a.insert(a.end(), {"--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache",
                     "--ro-bind-try", "/etc/alternatives", "/etc/alternatives",
                     "--proc",        "/proc",
                     "--dev",         "/dev",
                     "--tmpfs",       "/tmp"});
  bound.push_back("/etc/alternatives");
  std::vector<std::string> hidden;
  for (const auto& h : spec.hidden) hidden.push_back(Canonical(h));
  for (const auto& path : spec.read_only) {
    std::string p = Canonical(path);
    bool inside_hidden = false;
    for (const auto& h : hidden) inside_hidden = inside_hidden || Within(p, h);
    // "/" would bind everything; a hidden directory stays hidden.
    if (p == "/" || inside_hidden) continue;
    a.insert(a.end(), {"--ro-bind-try", p, p});
    bound.push_back(p);
  }
  // KEEL_HOME (owner.token, the database, keys) and the other agents' workspaces: covered
  // wherever a bound directory holds them.
  for (const auto& h : hidden) {
    bool exposed = false;
    for (const auto& b : bound) exposed = exposed || Within(h, b);
    if (exposed) a.insert(a.end(), {"--tmpfs", h});
  }
  if (!spec.workspace.empty()) {
    a.insert(a.end(), {"--bind", spec.workspace, "/workspace", "--chdir", "/workspace"});
  } else {
    a.insert(a.end(), {"--chdir", "/tmp"});
  }
  if (!spec.env.empty()) {
    a.push_back("--clearenv");
    for (const auto& e : spec.env) {
      size_t eq = e.find('=');
      if (eq == std::string::npos || eq == 0) return InvalidArgument("bad environment entry");
      a.insert(a.end(), {"--setenv", e.substr(0, eq), e.substr(eq + 1)});
    }
  }
  a.push_back("--");
  a.insert(a.end(), spec.argv.begin(), spec.argv.end());
  return a;
}

Result<std::vector<std::string>> SandboxArgv(const std::string& workspace,
                                             const std::string& command,
                                             const std::vector<std::string>& hidden) {
  SandboxSpec spec;
  spec.argv = {"/bin/sh", "-c", command};
  spec.workspace = workspace;
  spec.hidden = hidden;
  spec.env = {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/workspace", "LANG=C.UTF-8"};
  return SandboxArgv(spec);
}

Status RegisterWorkspaceTools(ToolRegistry& registry, const ExecOptions& options) {
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<FilesRead>()));
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<FilesWrite>()));
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<FilesList>()));
  KEEL_RETURN_IF_ERROR(registry.Register(std::make_unique<Exec>(options)));
  return Status::Ok();
}

Status RegisterWorkspaceTools(ToolRegistry& registry) {
  return RegisterWorkspaceTools(registry, ExecOptions{});
}

}  // namespace keel::tools
