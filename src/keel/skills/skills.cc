#include "keel/skills/skills.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include "keel/common/crypto.h"
#include "keel/tools/workspace.h"

namespace keel::skills {
namespace {

namespace fs = std::filesystem;

std::string Trim(std::string_view s) {
  size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return "";
  size_t e = s.find_last_not_of(" \t\r");
  return std::string(s.substr(b, e - b + 1));
}

bool IsDelimiter(std::string_view line) { return Trim(line) == "---"; }

// A quoted scalar ("..." or '...'); *rest is what follows the closing quote.
Result<std::string> Unquote(const std::string& v, std::string* rest) {
  const char q = v[0];
  std::string out;
  for (size_t i = 1; i < v.size(); ++i) {
    char c = v[i];
    if (q == '\'' && c == '\'') {
      if (i + 1 < v.size() && v[i + 1] == '\'') {
        out += '\'';
        ++i;
        continue;
      }
      *rest = Trim(v.substr(i + 1));
      return out;
    }
    if (q == '"' && c == '"') {
      *rest = Trim(v.substr(i + 1));
      return out;
    }
    if (q == '"' && c == '\\' && i + 1 < v.size()) {
      char n = v[++i];
      out += n == 'n' ? '\n' : n == 't' ? '\t' : n;
      continue;
    }
    out += c;
  }
  return InvalidArgument(std::string("a value opened with ") + q + " is not closed on its line");
}

// Standard base64 (RFC 4648, padding optional) through the url-safe decoder.
Result<std::string> DecodeBase64(std::string text) {
  while (!text.empty() && text.back() == '=') text.pop_back();
  for (char& c : text) {
    if (c == '+')
      c = '-';
    else if (c == '/')
      c = '_';
    else if (c == '-' || c == '_')
      return InvalidArgument("not base64");
  }
  std::string out = Base64UrlDecode(text);
  if (out.empty() && !text.empty()) return InvalidArgument("not base64");
  return out;
}

std::string EncodeBase64(std::string_view data) {
  std::string out = Base64UrlEncode(data);
  for (char& c : out) {
    if (c == '-')
      c = '+';
    else if (c == '_')
      c = '/';
  }
  while (out.size() % 4) out += '=';
  return out;
}

// Writes `data` to a new file (never through a link, never over an existing file).
Status WriteNewFile(const fs::path& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return Unavailable("cannot create " + path.string() + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      return Unavailable("cannot write " + path.string() + ": " + std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return Status::Ok();
}

std::string ReadSmallFile(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "";
  char buf[128];
  ssize_t n = ::read(fd, buf, sizeof buf);
  ::close(fd);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

}  // namespace

Status CheckSkillName(const std::string& name) {
  bool ok = !name.empty() && name.size() <= 64;
  for (char c : name) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
  if (!ok) {
    return InvalidArgument("skill name '" + name +
                           "' must be 1 to 64 characters of a-z, 0-9 and "
                           "'-'");
  }
  return Status::Ok();
}

Status CheckSkillPath(const std::string& path) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("file path '" + path + "' " + why);
  };
  if (path.empty()) return InvalidArgument("a file path is empty");
  if (path.size() > kMaxPathBytes) return bad("is longer than 255 bytes");
  if (path[0] == '/') return bad("is absolute; paths are relative to the skill's directory");
  for (unsigned char c : path) {
    if (c < 0x20 || c == 0x7f) return bad("contains a control character");
    if (c == '\\') return bad("contains a backslash; separate directories with '/'");
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string part = path.substr(start, end - start);
    if (part.empty()) return bad("has an empty component");
    if (part == "." || part == "..") return bad("contains '" + part + "'");
    start = end + 1;
  }
  return Status::Ok();
}

Result<FrontMatter> ParseFrontMatter(std::string_view text) {
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);  // a UTF-8 byte order mark
  std::vector<std::string_view> lines;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    lines.push_back(text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  if (lines.empty() || !IsDelimiter(lines[0])) {
    return InvalidArgument(
        "SKILL.md has no front matter: its first line must be '---', "
        "followed by 'name: ...' and 'description: ...' lines and a closing "
        "'---'");
  }
  size_t close = 1;
  while (close < lines.size() && !IsDelimiter(lines[close])) ++close;
  if (close == lines.size()) {
    return InvalidArgument("SKILL.md's front matter has no closing '---' line");
  }

  FrontMatter fm;
  std::string key;  // the entry being read
  char block = 0;   // '>' or '|' while reading a block scalar, 0 otherwise
  bool block_started = false;
  for (size_t i = 1; i < close; ++i) {
    std::string_view raw = lines[i];
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    std::string line = Trim(raw);
    const bool indented = !raw.empty() && (raw[0] == ' ' || raw[0] == '\t');
    if (indented && !key.empty()) {  // a continuation of `key`
      if (line.empty() && block != '|') continue;
      std::string& v = fm.fields[key];
      if (block_started || (!block && !v.empty())) v += block == '|' ? "\n" : " ";
      v += line;
      block_started = true;
      continue;
    }
    if (line.empty() || line[0] == '#') continue;
    size_t colon = line.find(':');
    std::string k = colon == std::string::npos ? "" : Trim(std::string_view(line).substr(0, colon));
    bool key_ok = !k.empty();
    for (char c : k)
      key_ok = key_ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-');
    if (indented || !key_ok) {
      return InvalidArgument("line " + std::to_string(i + 1) +
                             " of SKILL.md's front matter is "
                             "not 'key: value': " +
                             line);
    }
    if (fm.fields.count(k)) {
      return InvalidArgument("SKILL.md's front matter sets '" + k + "' twice");
    }
    std::string v = Trim(std::string_view(line).substr(colon + 1));
    block = 0;
    block_started = false;
    if (v == ">" || v == ">-" || v == "|" || v == "|-") {
      block = v[0];
      v.clear();
    } else if (!v.empty() && (v[0] == '"' || v[0] == '\'')) {
      std::string rest;
      auto unquoted = Unquote(v, &rest);
      if (!unquoted.ok()) {
        return InvalidArgument("SKILL.md's front matter, '" + k +
                               "': " + unquoted.status().message());
      }
      if (!rest.empty() && rest[0] != '#') {
        return InvalidArgument("SKILL.md's front matter, '" + k +
                               "': text after the closing "
                               "quote");
      }
      v = *unquoted;
    } else if (size_t hash = v.find(" #"); hash != std::string::npos) {
      v = Trim(std::string_view(v).substr(0, hash));
    }
    fm.fields[k] = v;
    key = k;
  }
  for (size_t i = close + 1; i < lines.size(); ++i) {
    fm.body += lines[i];
    if (i + 1 < lines.size()) fm.body += '\n';
  }

  auto name = fm.fields.find("name");
  if (name == fm.fields.end() || name->second.empty()) {
    return InvalidArgument("SKILL.md's front matter has no 'name'");
  }
  auto description = fm.fields.find("description");
  if (description == fm.fields.end() || Trim(description->second).empty()) {
    return InvalidArgument("SKILL.md's front matter has no 'description'");
  }
  fm.name = name->second;
  fm.description = Trim(description->second);
  KEEL_RETURN_IF_ERROR(CheckSkillName(fm.name));
  if (fm.description.size() > kMaxDescriptionBytes) {
    return InvalidArgument("the description in SKILL.md's front matter is longer than " +
                           std::to_string(kMaxDescriptionBytes) + " bytes");
  }
  return fm;
}

Result<store::Skill> SkillOf(const Json& files) {
  if (!files.is_object()) {
    return InvalidArgument("files must be an object of {\"PATH\": TEXT or {\"base64\": DATA}}");
  }
  if (files.size() > kMaxFiles) {
    return InvalidArgument("a skill has at most " + std::to_string(kMaxFiles) + " files, got " +
                           std::to_string(files.size()));
  }
  if (!files.contains("SKILL.md")) return InvalidArgument("a skill needs a file SKILL.md");
  store::Skill skill;
  skill.files = Json::object();
  std::string hashed;  // path, size and bytes of each file in path order (the object's order)
  for (auto it = files.begin(); it != files.end(); ++it) {
    const std::string& path = it.key();
    KEEL_RETURN_IF_ERROR(CheckSkillPath(path));
    // A path cannot be both a file and a directory.
    const auto& object = files.get_ref<const Json::object_t&>();
    auto under = object.lower_bound(path + "/");
    if (under != object.end() && under->first.starts_with(path + "/")) {
      return InvalidArgument("file path '" + path + "' is also a directory of '" + under->first +
                             "'");
    }
    std::string bytes;
    bool binary = false;
    if (it->is_string()) {
      bytes = it->get<std::string>();
    } else if (it->is_object() && it->size() == 1 && it->contains("base64") &&
               (*it)["base64"].is_string()) {
      auto decoded = DecodeBase64((*it)["base64"].get<std::string>());
      if (!decoded.ok()) return InvalidArgument("file '" + path + "': base64 is not valid");
      bytes = std::move(*decoded);
      binary = true;
    } else {
      return InvalidArgument("file '" + path + "' must be text or {\"base64\": DATA}");
    }
    if (bytes.size() > kMaxFileBytes) {
      return InvalidArgument("file '" + path + "' is larger than 1 MiB");
    }
    skill.bytes += static_cast<int64_t>(bytes.size());
    if (skill.bytes > static_cast<int64_t>(kMaxSkillBytes)) {
      return InvalidArgument("the skill's files are larger than 8 MiB together");
    }
    if (path == "SKILL.md" && binary) return InvalidArgument("SKILL.md must be text");
    skill.manifest.push_back({{"path", path}, {"bytes", bytes.size()}, {"binary", binary}});
    skill.files[path] = binary ? Json{{"base64", EncodeBase64(bytes)}} : Json(bytes);
    hashed += path + '\0' + std::to_string(bytes.size()) + '\0' + bytes;
  }
  KEEL_ASSIGN_OR_RETURN(FrontMatter fm, ParseFrontMatter(files["SKILL.md"].get<std::string>()));
  skill.name = fm.name;
  skill.description = fm.description;
  skill.hash = Sha256Hex(hashed);
  return skill;
}

Result<std::string> FileBytes(const store::Skill& skill, const std::string& path) {
  if (!skill.files.is_object() || !skill.files.contains(path)) {
    return NotFound("skill " + skill.name + " has no file '" + path + "'");
  }
  const Json& f = skill.files[path];
  if (f.is_string()) return f.get<std::string>();
  if (f.is_object() && f.contains("base64") && f["base64"].is_string()) {
    return DecodeBase64(f["base64"].get<std::string>());
  }
  return Internal("skill " + skill.name + ": file '" + path + "' is stored in an unknown shape");
}

std::string SkillIndex(const std::vector<store::Skill>& skills) {
  if (skills.empty()) return "";
  std::string out =
      "## Skills\n"
      "You have these skills. Before you use one, read its instructions with the skills.read "
      "tool ({\"name\": NAME}); it can also read a skill's other files ({\"name\": NAME, "
      "\"file\": PATH}), which are in your workspace under skills/NAME/ as well.\n";
  for (const auto& s : skills) out += "- " + s.name + ": " + s.description + "\n";
  return out;
}

std::vector<std::string> StaleSkills(const std::string& workspace,
                                     const std::vector<store::Skill>& skills) {
  std::vector<std::string> out;
  for (const auto& s : skills) {
    std::error_code ec;
    bool current =
        ReadSmallFile(fs::path(workspace) / ".keel/skills" / (s.name + ".sha256")) == s.hash &&
        fs::is_directory(fs::symlink_status(fs::path(workspace) / "skills" / s.name, ec));
    if (!current) out.push_back(s.name);
  }
  return out;
}

Status SyncWorkspace(const std::string& workspace, const std::vector<store::Skill>& skills) {
  KEEL_ASSIGN_OR_RETURN(std::string root_text, tools::ResolveInWorkspace(workspace, "skills"));
  KEEL_ASSIGN_OR_RETURN(std::string marks_text,
                        tools::ResolveInWorkspace(workspace, ".keel/skills"));
  const fs::path root(root_text), marks(marks_text);
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) return Unavailable("cannot create " + root.string() + ": " + ec.message());
  fs::create_directories(marks, ec);
  if (ec) return Unavailable("cannot create " + marks.string() + ": " + ec.message());

  std::set<std::string> assigned;
  for (const auto& s : skills) {
    assigned.insert(s.name);
    if (s.files.is_null()) continue;  // its copy is current
    // A fresh directory, written whole, then renamed over the old copy.
    const fs::path fresh = root / (".tmp-" + s.name + "-" + RandomHex(8));
    fs::create_directory(fresh, ec);
    if (ec) return Unavailable("cannot create " + fresh.string() + ": " + ec.message());
    for (auto it = s.files.begin(); it != s.files.end(); ++it) {
      KEEL_RETURN_IF_ERROR(CheckSkillPath(it.key()));  // never trust what was stored
      KEEL_ASSIGN_OR_RETURN(std::string bytes, FileBytes(s, it.key()));
      const fs::path target = fresh / it.key();
      fs::create_directories(target.parent_path(), ec);
      if (ec)
        return Unavailable("cannot create " + target.parent_path().string() + ": " + ec.message());
      KEEL_RETURN_IF_ERROR(WriteNewFile(target, bytes));
    }
    const fs::path dir = root / s.name;
    fs::remove_all(dir, ec);  // a link is removed, not followed
    fs::rename(fresh, dir, ec);
    if (ec)
      return Unavailable("cannot move " + fresh.string() + " to " + dir.string() + ": " +
                         ec.message());
    const fs::path mark = marks / (s.name + ".sha256");
    fs::remove(mark, ec);
    KEEL_RETURN_IF_ERROR(WriteNewFile(mark, s.hash));
  }
  // What is not an assigned skill goes: unassigned and deleted skills, leftovers of a failed copy.
  for (const fs::path& dir : {root, marks}) {
    std::vector<fs::path> gone;
    for (const auto& entry : fs::directory_iterator(dir, ec)) {
      std::string name = entry.path().filename().string();
      if (dir == marks && name.ends_with(".sha256")) name.resize(name.size() - 7);
      if (!assigned.count(name)) gone.push_back(entry.path());
    }
    for (const auto& p : gone) fs::remove_all(p, ec);
  }
  return Status::Ok();
}

}  // namespace keel::skills
