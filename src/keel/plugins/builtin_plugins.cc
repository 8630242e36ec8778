#include "keel/plugins/builtin_plugins.h"

#include <fcntl.h>
#include <re2/re2.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "keel/common/time.h"
#include "keel/plugins/bus.h"
#include "keel/plugins/catalog.h"
#include "keel/plugins/manifest.h"

namespace keel::plugins {

namespace {

constexpr size_t kMaxPatterns = 50;
constexpr size_t kMaxPatternLength = 500;

// The value a handler of `shape` returns when it changes nothing.
Json KeepFor(Shape shape) {
  if (shape == Shape::kTransform) return plugins::Unchanged();
  if (shape == Shape::kVeto) return Json{{"allow", true}};
  return Json();
}

// The audit file of one plugin instance, opened at its first line and kept open.
class AuditFile {
 public:
  explicit AuditFile(std::string path) : path_(std::move(path)) {}
  ~AuditFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  AuditFile(const AuditFile&) = delete;
  AuditFile& operator=(const AuditFile&) = delete;

  Status Append(std::string data) {
    if (fd_ < 0) {
      std::error_code ec;
      std::filesystem::create_directories(std::filesystem::path(path_).parent_path(), ec);
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
      if (fd_ < 0) return Unavailable("cannot open the audit file " + path_);
    }
    data += '\n';
    ssize_t n = ::write(fd_, data.data(), data.size());  // one write: lines never interleave
    if (n != static_cast<ssize_t>(data.size())) return Unavailable("cannot write " + path_);
    return Status::Ok();
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// Strings a redactor found none of its patterns in. A turn's model.before payload holds the
// whole conversation, which every turn checked before but for its newest messages: those found
// clean are not scanned again. Exact (a pattern's match depends on the string alone) and safe
// from any thread. Bounded: an agent's redactor keeps at most kMaxBytes (then forgets them all at
// once), the process at most kMaxTotal over every agent's (then a redactor keeps no more), and
// strings over kMaxString are not kept.
class CleanStrings {
 public:
  CleanStrings() = default;
  CleanStrings(const CleanStrings&) = delete;
  CleanStrings& operator=(const CleanStrings&) = delete;
  ~CleanStrings() { total_ -= bytes_; }

  bool Contains(const std::string& s) const {
    std::lock_guard<std::mutex> lock(mu_);
    return set_.contains(s);
  }
  void Add(const std::string& s) {
    if (s.size() > kMaxString) return;
    const size_t n = s.size() + sizeof(std::string) + 16;  // and the set's node
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes_ + n > kMaxBytes) {
      total_ -= bytes_;
      set_.clear();
      bytes_ = 0;
    }
    if (total_ + n > kMaxTotal) return;
    if (set_.insert(s).second) {
      bytes_ += n;
      total_ += n;
    }
  }

 private:
  static constexpr size_t kMaxString = 16 * 1024;
  static constexpr size_t kMaxBytes = 1024 * 1024;
  static constexpr size_t kMaxTotal = 64 * 1024 * 1024;
  static inline std::atomic<size_t> total_{0};
  mutable std::mutex mu_;
  std::unordered_set<std::string> set_;  // GUARDED_BY(mu_)
  size_t bytes_ = 0;                     // GUARDED_BY(mu_)
};

struct Redactor {
  std::vector<std::unique_ptr<RE2>> patterns;
  // All the patterns as one alternation: a string none of them matches (most strings) is
  // scanned once, not once per pattern. Null when it did not compile (then each is tried).
  std::unique_ptr<RE2> any;
  std::string mask;
  mutable CleanStrings clean;

  bool MatchesString(const std::string& s) const {
    if (clean.Contains(s)) return false;
    bool found = false;
    if (any) {
      found = RE2::PartialMatch(s, *any);
    } else {
      for (const auto& re : patterns) {
        if (RE2::PartialMatch(s, *re)) {
          found = true;
          break;
        }
      }
    }
    if (!found) clean.Add(s);
    return found;
  }

  // Whether a pattern matches a string in `j`.
  bool Matches(const Json& j) const {
    if (j.is_string()) return MatchesString(j.get_ref<const std::string&>());
    if (j.is_array() || j.is_object()) {
      for (const auto& v : j) {
        if (Matches(v)) return true;
      }
    }
    return false;
  }

  void Apply(Json& j) const {
    if (j.is_string()) {
      std::string& s = j.get_ref<std::string&>();
      if (any && !RE2::PartialMatch(s, *any)) return;
      for (const auto& re : patterns) RE2::GlobalReplace(&s, *re, mask);
    } else if (j.is_array() || j.is_object()) {
      for (auto& v : j) Apply(v);
    }
  }
};

Result<std::shared_ptr<Redactor>> RedactorOf(const Json& config) {
  if (!config.is_object()) return InvalidArgument("redaction: config must be an object");
  for (auto it = config.begin(); it != config.end(); ++it) {
    if (it.key() != "patterns" && it.key() != "mask") {
      return InvalidArgument("redaction: unknown config field '" + it.key() + "'");
    }
  }
  if (!config.contains("patterns") || !config["patterns"].is_array() ||
      config["patterns"].empty() || config["patterns"].size() > kMaxPatterns) {
    return InvalidArgument("redaction: config.patterns must list 1 to 50 regular expressions");
  }
  auto r = std::make_shared<Redactor>();
  r->mask = "[REDACTED]";
  if (config.contains("mask")) {
    if (!config["mask"].is_string()) return InvalidArgument("redaction: config.mask must be a string");
    r->mask = config["mask"].get<std::string>();
  }
  // The mask is inserted as is: RE2 would read "\1" in it as a group.
  std::string literal;
  for (char c : r->mask) {
    if (c == '\\') literal += '\\';
    literal += c;
  }
  r->mask = literal;
  for (const auto& p : config["patterns"]) {
    if (!p.is_string() || p.get_ref<const std::string&>().empty() ||
        p.get_ref<const std::string&>().size() > kMaxPatternLength) {
      return InvalidArgument("redaction: each pattern must be a non-empty string of at most 500 "
                             "characters");
    }
    auto re = std::make_unique<RE2>(p.get<std::string>(), RE2::Quiet);
    if (!re->ok()) {
      return InvalidArgument("redaction: pattern '" + p.get<std::string>() + "' is not a valid "
                             "RE2 regular expression: " + re->error());
    }
    r->patterns.push_back(std::move(re));
  }
  std::string alternation;
  for (const auto& p : config["patterns"]) {
    alternation += (alternation.empty() ? "(?:" : "|(?:") + p.get<std::string>() + ")";
  }
  r->any = std::make_unique<RE2>(alternation, RE2::Quiet);
  if (!r->any->ok()) r->any.reset();
  return r;
}

}  // namespace

Status CheckBuiltin(const Manifest& m, const Json& config) {
  if (m.builtin == "audit-log") {
    if (config.is_object() && !config.empty()) {
      return InvalidArgument("audit-log takes no config");
    }
    return Status::Ok();
  }
  if (m.builtin == "redaction") {
    for (const auto& e : m.events) {
      if (FindEvent(e)->shape != Shape::kTransform) {
        return InvalidArgument("redaction transforms payloads; '" + e + "' is not a transform "
                               "event");
      }
    }
    return RedactorOf(config).status();
  }
  return InvalidArgument("manifest.builtin: unknown built-in plugin '" + m.builtin +
                         "' (there are audit-log and redaction)");
}

Status AddBuiltin(const Manifest& m, const Json& config, const BuiltinContext& context,
                  EventBus& bus) {
  KEEL_RETURN_IF_ERROR(CheckBuiltin(m, config));
  HookOptions options;
  options.plugin_id = m.id;
  options.priority = m.priority;
  options.fail_turn = m.fail_turn;
  std::shared_ptr<AuditFile> audit;
  std::shared_ptr<Redactor> redactor;
  for (const auto& event : m.events) {
    const Shape shape = FindEvent(event)->shape;
    std::function<Result<Json>(const Json&)> fn;  // they answer at once
    if (m.builtin == "audit-log") {
      if (!audit) audit = std::make_shared<AuditFile>(context.audit_file);
      // {"at", "event", "payload"}, written out without copying the payload.
      const std::string event_field = ",\"event\":" + DumpJson(Json(event)) + ",\"payload\":";
      fn = [audit, event_field, shape](const Json& payload) -> Result<Json> {
        KEEL_RETURN_IF_ERROR(audit->Append("{\"at\":\"" + FormatRfc3339(NowMillis()) + "\"" +
                                           event_field + DumpJson(payload) + "}"));
        return KeepFor(shape);
      };
    } else {
      if (!redactor) {
        KEEL_ASSIGN_OR_RETURN(redactor, RedactorOf(config));
      }
      fn = [redactor](const Json& payload) -> Result<Json> {
        if (!redactor->Matches(payload)) return Unchanged();  // most payloads: no copy
        Json out = payload;
        redactor->Apply(out);
        return out;
      };
    }
    KEEL_RETURN_IF_ERROR(bus.On(event, Immediate(std::move(fn)), options));
  }
  return Status::Ok();
}

}  // namespace keel::plugins
