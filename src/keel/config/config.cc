#include "keel/config/config.h"

#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string_view>

#include "keel/config/http_config.h"
#include "keel/config/limits_config.h"
#include "keel/http/cors.h"
#include "keel/http/outbound_guard.h"

namespace keel::config {

namespace {

constexpr int64_t kMaxConnections = 1000000;
constexpr int64_t kMaxHttpTimeoutMs = 3600000;
constexpr int64_t kMaxToolThreads = 1024;
constexpr int64_t kMaxStallMs = 3600000;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

Status ParseInt(const std::string& text, const std::string& source, int64_t lo, int64_t hi,
                int64_t* out) {
  try {
    size_t used = 0;
    long long v = std::stoll(text, &used);
    if (used == text.size() && v >= lo && v <= hi) {
      *out = v;
      return Status::Ok();
    }
  } catch (...) {
  }
  return InvalidArgument(source + " must be an integer from " + std::to_string(lo) + " to " +
                         std::to_string(hi) + ", got '" + text + "'");
}

template <typename T>
Status SetInt(const std::string& text, const std::string& source, int64_t lo, int64_t hi, T* out) {
  int64_t v = 0;
  KEEL_RETURN_IF_ERROR(ParseInt(text, source, lo, hi, &v));
  *out = static_cast<T>(v);
  return Status::Ok();
}

// An integer setting of a section: "SECTION.KEY must be an integer from LO to HI".
template <typename T>
Status SectionInt(const std::string& path, const std::string& name, const toml::node& v,
                  int64_t lo, int64_t hi, T* out) {
  auto iv = v.value<int64_t>();
  if (!v.is_integer() || !iv || *iv < lo || *iv > hi) {
    return InvalidArgument(path + ": " + name + " must be an integer from " + std::to_string(lo) +
                           " to " + std::to_string(hi));
  }
  *out = static_cast<T>(*iv);
  return Status::Ok();
}

Status CheckOutboundAllow(const std::string& source, const std::vector<std::string>& cidrs) {
  for (const auto& cidr : cidrs) {
    if (auto parsed = http::Cidr::Parse(cidr); !parsed.ok()) {
      return InvalidArgument(source + ": " + parsed.status().message());
    }
  }
  return Status::Ok();
}

Status ApplyAnthropic(const std::string& path, const toml::table& t, AnthropicConfig& a) {
  auto node = t["anthropic"];
  if (!node) return Status::Ok();
  if (!node.is_table()) return InvalidArgument(path + ": [anthropic] must be a table");
  for (const auto& [k, v] : *node.as_table()) {
    std::string key(k.str());
    std::string name = "anthropic." + key;
    if (key == "base_url" || key == "api_key") {
      if (!v.is_string()) return InvalidArgument(path + ": " + name + " must be a string");
      (key == "base_url" ? a.base_url : a.api_key) = *v.value<std::string>();
    } else if (key == "timeout_ms") {
      KEEL_RETURN_IF_ERROR(SectionInt(path, name, v, 1, 3600000, &a.timeout_ms));
    } else if (key == "max_retries") {
      KEEL_RETURN_IF_ERROR(SectionInt(path, name, v, 0, 100, &a.max_retries));
    } else if (key == "max_tokens") {
      KEEL_RETURN_IF_ERROR(SectionInt(path, name, v, 1, 1000000, &a.max_tokens));
    } else {
      return InvalidArgument(path + ": unknown setting '" + name + "'");
    }
  }
  return Status::Ok();
}

// [prices."MODEL"] input_per_mtok = USD, output_per_mtok = USD (per million tokens).
Status ApplyPrices(const std::string& path, const toml::table& t,
                   std::map<std::string, ModelPrice>& prices) {
  auto node = t["prices"];
  if (!node) return Status::Ok();
  if (!node.is_table()) return InvalidArgument(path + ": [prices] must be a table");
  for (const auto& [model, entry] : *node.as_table()) {
    std::string where = "prices.\"" + std::string(model.str()) + "\"";
    if (!entry.is_table()) {
      return InvalidArgument(path + ": " + where + " must be a table with input_per_mtok and "
                             "output_per_mtok (USD per million tokens)");
    }
    ModelPrice price;
    for (const auto& [k, v] : *entry.as_table()) {
      std::string key(k.str());
      if (key != "input_per_mtok" && key != "output_per_mtok") {
        return InvalidArgument(path + ": unknown setting '" + where + "." + key + "'");
      }
      std::optional<double> usd;
      if (v.is_integer()) usd = static_cast<double>(*v.value<int64_t>());
      if (v.is_floating_point()) usd = *v.value<double>();
      if (!usd || !(*usd >= 0) || *usd > 1e6) {
        return InvalidArgument(path + ": " + where + "." + key +
                               " must be a number of USD per million tokens from 0 to 1000000");
      }
      int64_t micros = std::llround(*usd * 1e6);
      (key == "input_per_mtok" ? price.input_microusd_per_mtok
                               : price.output_microusd_per_mtok) = micros;
    }
    prices[std::string(model.str())] = price;
  }
  return Status::Ok();
}

Status ApplyCache(const std::string& path, const toml::table& t, CacheConfig& cache) {
  auto node = t["cache"];
  if (!node) return Status::Ok();
  if (!node.is_table()) return InvalidArgument(path + ": [cache] must be a table");
  for (const auto& [k, v] : *node.as_table()) {
    std::string key(k.str());
    std::string name = "cache." + key;
    if (key == "enabled") {
      if (!v.is_boolean()) return InvalidArgument(path + ": " + name + " must be true or false");
      cache.enabled = *v.value<bool>();
    } else if (key == "ttl_ms") {
      KEEL_RETURN_IF_ERROR(SectionInt(path, name, v, 1000, int64_t(365) * 86400000, &cache.ttl_ms));
    } else if (key == "max_entries") {
      KEEL_RETURN_IF_ERROR(SectionInt(path, name, v, 1, 100000000, &cache.max_entries));
    } else if (key == "max_entry_bytes") {
      KEEL_RETURN_IF_ERROR(
          SectionInt(path, name, v, 1024, int64_t(64) << 20, &cache.max_entry_bytes));
    } else {
      return InvalidArgument(path + ": unknown setting '" + name + "'");
    }
  }
  return Status::Ok();
}

Status ApplyToml(const std::string& path, Config& c, HttpConfig& http, LimitsConfig& limits) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& err) {
    return InvalidArgument("cannot parse " + path + " at line " +
                           std::to_string(err.source().begin.line) + ": " +
                           std::string(err.description()));
  }
  static const std::set<std::string> kTop = {"listen",
                                             "store",
                                             "store_owner",
                                             "workspaces",
                                             "durable",
                                             "max_body_bytes",
                                             "max_connections",
                                             "max_connections_per_address",
                                             "header_timeout_ms",
                                             "body_timeout_ms",
                                             "idle_timeout_ms",
                                             "tenant_run_cap",
                                             "max_concurrent_runs",
                                             "tenant_max_running",
                                             "tool_threads",
                                             "tenant_tool_threads",
                                             "io_stall_warn_ms",
                                             "io_stall_limit_ms",
                                             "max_steps",
                                             "lease_ms",
                                             "drain_timeout_ms",
                                             "approval_timeout_ms",
                                             "large_result_bytes",
                                             "history_limit",
                                             "log_level",
                                             "outbound_allow",
                                             "cors_origins",
                                             "public_url",
                                             "exec_uid",
                                             "exec_gid",
                                             "openai",
                                             "anthropic",
                                             "prices",
                                             "cache"};
  for (const auto& [k, v] : t) {
    if (!kTop.count(std::string(k.str()))) {
      return InvalidArgument(path + ": unknown setting '" + std::string(k.str()) + "'");
    }
  }
  auto str = [&](const char* key, std::string* out) -> Status {
    if (auto n = t[key]; n) {
      if (!n.is_string()) return InvalidArgument(path + ": " + key + " must be a string");
      *out = n.value<std::string>().value();
    }
    return Status::Ok();
  };
  auto num = [&](const char* key, int64_t lo, int64_t hi, auto* out) -> Status {
    if (auto n = t[key]; n) {
      auto v = n.value<int64_t>();
      if (!n.is_integer() || !v || *v < lo || *v > hi) {
        return InvalidArgument(path + ": " + key + " must be an integer from " +
                               std::to_string(lo) + " to " + std::to_string(hi));
      }
      *out = static_cast<std::remove_pointer_t<decltype(out)>>(*v);
    }
    return Status::Ok();
  };
  KEEL_RETURN_IF_ERROR(str("listen", &c.listen));
  KEEL_RETURN_IF_ERROR(str("store", &c.store_url));
  KEEL_RETURN_IF_ERROR(str("store_owner", &c.store_owner_url));
  KEEL_RETURN_IF_ERROR(str("workspaces", &c.workspaces));
  KEEL_RETURN_IF_ERROR(str("log_level", &c.log_level));
  KEEL_RETURN_IF_ERROR(str("public_url", &c.public_url));
  if (auto n = t["durable"]; n) {
    if (!n.is_boolean()) return InvalidArgument(path + ": durable must be true or false");
    c.durable = n.value<bool>().value();
  }
  KEEL_RETURN_IF_ERROR(num("max_body_bytes", 1024, int64_t(1) << 30, &c.max_body_bytes));
  KEEL_RETURN_IF_ERROR(num("max_connections", 1, kMaxConnections, &http.max_connections));
  KEEL_RETURN_IF_ERROR(num("max_connections_per_address", 1, kMaxConnections,
                           &http.max_connections_per_address));
  KEEL_RETURN_IF_ERROR(
      num("header_timeout_ms", 100, kMaxHttpTimeoutMs, &http.header_timeout_ms));
  KEEL_RETURN_IF_ERROR(num("body_timeout_ms", 100, kMaxHttpTimeoutMs, &http.body_timeout_ms));
  KEEL_RETURN_IF_ERROR(num("idle_timeout_ms", 100, kMaxHttpTimeoutMs, &http.idle_timeout_ms));
  KEEL_RETURN_IF_ERROR(num("tenant_run_cap", 1, 1000000, &c.tenant_run_cap));
  KEEL_RETURN_IF_ERROR(num("max_concurrent_runs", 1, 100000, &c.max_concurrent_runs));
  KEEL_RETURN_IF_ERROR(num("tenant_max_running", 1, 100000, &limits.tenant_max_running));
  KEEL_RETURN_IF_ERROR(num("tool_threads", 1, kMaxToolThreads, &limits.tool_threads));
  KEEL_RETURN_IF_ERROR(
      num("tenant_tool_threads", 1, kMaxToolThreads, &limits.tenant_tool_threads));
  KEEL_RETURN_IF_ERROR(num("io_stall_warn_ms", 100, kMaxStallMs, &limits.io_stall_warn_ms));
  KEEL_RETURN_IF_ERROR(num("io_stall_limit_ms", 1000, kMaxStallMs, &limits.io_stall_limit_ms));
  KEEL_RETURN_IF_ERROR(num("max_steps", 1, 1000, &c.max_steps));
  KEEL_RETURN_IF_ERROR(num("lease_ms", 1000, 3600000, &c.lease_ms));
  KEEL_RETURN_IF_ERROR(num("drain_timeout_ms", 0, 3600000, &c.drain_timeout_ms));
  KEEL_RETURN_IF_ERROR(
      num("approval_timeout_ms", 1000, int64_t(365) * 86400000, &c.approval_timeout_ms));
  KEEL_RETURN_IF_ERROR(num("large_result_bytes", 1024, int64_t(64) << 20, &c.large_result_bytes));
  KEEL_RETURN_IF_ERROR(num("history_limit", 0, 10000, &c.history_limit));
  if (auto n = t["outbound_allow"]; n) {
    if (!n.is_array()) return InvalidArgument(path + ": outbound_allow must be an array of CIDRs");
    c.outbound_allow.clear();
    for (const auto& item : *n.as_array()) {
      if (!item.is_string()) {
        return InvalidArgument(path + ": outbound_allow must be an array of CIDRs");
      }
      c.outbound_allow.push_back(*item.value<std::string>());
    }
    KEEL_RETURN_IF_ERROR(CheckOutboundAllow(path + ": outbound_allow", c.outbound_allow));
  }
  if (auto n = t["cors_origins"]; n) {
    const std::string what = path + ": cors_origins must be an array of origins";
    if (!n.is_array()) return InvalidArgument(what);
    c.cors_origins.clear();
    for (const auto& item : *n.as_array()) {
      if (!item.is_string()) return InvalidArgument(what);
      c.cors_origins.push_back(*item.value<std::string>());
    }
    KEEL_RETURN_IF_ERROR(http::CheckCorsOrigins(path + ": cors_origins", c.cors_origins));
  }
  KEEL_RETURN_IF_ERROR(num("exec_uid", 1, 2147483647, &c.exec_uid));
  KEEL_RETURN_IF_ERROR(num("exec_gid", 1, 2147483647, &c.exec_gid));
  KEEL_RETURN_IF_ERROR(ApplyAnthropic(path, t, c.anthropic));
  KEEL_RETURN_IF_ERROR(ApplyPrices(path, t, c.prices));
  KEEL_RETURN_IF_ERROR(ApplyCache(path, t, c.cache));
  if (auto o = t["openai"]; o) {
    if (!o.is_table()) return InvalidArgument(path + ": [openai] must be a table");
    const toml::table& ot = *o.as_table();
    for (const auto& [k, v] : ot) {
      std::string key(k.str());
      if (key == "base_url" || key == "api_key") {
        if (!v.is_string()) return InvalidArgument(path + ": openai." + key + " must be a string");
        (key == "base_url" ? c.openai.base_url : c.openai.api_key) = *v.value<std::string>();
      } else if (key == "timeout_ms" || key == "max_retries") {
        auto iv = v.value<int64_t>();
        if (!v.is_integer() || !iv || *iv < 0 || *iv > 3600000) {
          return InvalidArgument(path + ": openai." + key + " must be a non-negative integer");
        }
        (key == "timeout_ms" ? c.openai.timeout_ms : c.openai.max_retries) = static_cast<int>(*iv);
      } else {
        return InvalidArgument(path + ": unknown setting 'openai." + key + "'");
      }
    }
  }
  return Status::Ok();
}

}  // namespace

std::string DefaultHome() {
  std::string home = Env("KEEL_HOME");
  if (!home.empty()) return home;
  std::string user_home = Env("HOME");
  if (user_home.empty()) user_home = ".";
  return user_home + "/.local/share/keel";
}

namespace {

// A share not set (0 while loading) is a quarter of its whole; a share may not exceed it.
Status ResolveShare(const char* share, const char* whole, int whole_value, int* value) {
  if (*value == 0) *value = std::max(1, whole_value / 4);
  if (*value > whole_value) {
    return InvalidArgument(std::string(share) + " (" + std::to_string(*value) +
                           ") must not exceed " + whole + " (" + std::to_string(whole_value) +
                           ")");
  }
  return Status::Ok();
}

// Every settings group, from one reading of the file and the environment.
Status LoadInto(const Overrides& o, Config& c, HttpConfig& http, LimitsConfig& limits) {
  limits.tenant_max_running = 0;   // unset until the file or the environment sets it
  limits.tenant_tool_threads = 0;
  c.home = o.home ? *o.home : DefaultHome();
  if (c.home.empty()) return InvalidArgument("KEEL_HOME must not be empty");

  std::string config_file = o.config_file ? *o.config_file : Env("KEEL_CONFIG");
  bool explicit_file = !config_file.empty();
  if (config_file.empty()) config_file = c.home + "/keel.toml";
  std::error_code ec;
  if (std::filesystem::exists(config_file, ec)) {
    KEEL_RETURN_IF_ERROR(ApplyToml(config_file, c, http, limits));
  } else if (explicit_file) {
    return InvalidArgument("config file not found: " + config_file);
  }

  // Provider settings honour the usual variables; KEEL_* ones follow.
  if (auto v = Env("OPENAI_API_KEY"); !v.empty()) c.openai.api_key = v;
  if (auto v = Env("OPENAI_BASE_URL"); !v.empty()) c.openai.base_url = v;
  if (auto v = Env("ANTHROPIC_API_KEY"); !v.empty()) c.anthropic.api_key = v;
  if (auto v = Env("ANTHROPIC_BASE_URL"); !v.empty()) c.anthropic.base_url = v;
  if (auto v = Env("KEEL_LISTEN"); !v.empty()) c.listen = v;
  if (auto v = Env("KEEL_STORE"); !v.empty()) c.store_url = v;
  if (auto v = Env("KEEL_STORE_OWNER"); !v.empty()) c.store_owner_url = v;
  if (auto v = Env("KEEL_WORKSPACES"); !v.empty()) c.workspaces = v;
  c.secret_kek = Env("KEEL_SECRET_KEK");
  if (auto file = Env("KEEL_SECRET_KEK_FILE"); !file.empty()) {
    if (!c.secret_kek.empty()) {
      return InvalidArgument("set KEEL_SECRET_KEK or KEEL_SECRET_KEK_FILE, not both");
    }
    std::ifstream in(file);
    std::stringstream text;
    if (!in || !(text << in.rdbuf())) {
      return InvalidArgument("KEEL_SECRET_KEK_FILE: cannot read " + file);
    }
    c.secret_kek = text.str();
    // The key is base64 on one line; its trailing newline is not part of it.
    while (!c.secret_kek.empty() && std::isspace(static_cast<unsigned char>(c.secret_kek.back()))) {
      c.secret_kek.pop_back();
    }
    if (c.secret_kek.empty()) return InvalidArgument("KEEL_SECRET_KEK_FILE: " + file + " is empty");
  }
  if (auto v = Env("KEEL_EXEC_UID"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(SetInt(v, "KEEL_EXEC_UID", 1, 2147483647, &c.exec_uid));
  }
  if (auto v = Env("KEEL_EXEC_GID"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(SetInt(v, "KEEL_EXEC_GID", 1, 2147483647, &c.exec_gid));
  }
  if (auto v = Env("KEEL_DURABLE"); !v.empty()) {
    if (v != "true" && v != "false" && v != "1" && v != "0") {
      return InvalidArgument("KEEL_DURABLE must be true or false, got '" + v + "'");
    }
    c.durable = v == "true" || v == "1";
  }
  if (auto v = Env("KEEL_TENANT_RUN_CAP"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(SetInt(v, "KEEL_TENANT_RUN_CAP", 1, 1000000, &c.tenant_run_cap));
  }
  if (auto v = Env("KEEL_MAX_CONCURRENT_RUNS"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(SetInt(v, "KEEL_MAX_CONCURRENT_RUNS", 1, 100000, &c.max_concurrent_runs));
  }
  if (auto v = Env("KEEL_TENANT_MAX_RUNNING"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(
        SetInt(v, "KEEL_TENANT_MAX_RUNNING", 1, 100000, &limits.tenant_max_running));
  }
  if (auto v = Env("KEEL_TOOL_THREADS"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(SetInt(v, "KEEL_TOOL_THREADS", 1, kMaxToolThreads, &limits.tool_threads));
  }
  if (auto v = Env("KEEL_TENANT_TOOL_THREADS"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(SetInt(v, "KEEL_TENANT_TOOL_THREADS", 1, kMaxToolThreads,
                                &limits.tenant_tool_threads));
  }
  if (auto v = Env("KEEL_IO_STALL_WARN_MS"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(
        SetInt(v, "KEEL_IO_STALL_WARN_MS", 100, kMaxStallMs, &limits.io_stall_warn_ms));
  }
  if (auto v = Env("KEEL_IO_STALL_LIMIT_MS"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(
        SetInt(v, "KEEL_IO_STALL_LIMIT_MS", 1000, kMaxStallMs, &limits.io_stall_limit_ms));
  }
  if (auto v = Env("KEEL_MAX_STEPS"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(SetInt(v, "KEEL_MAX_STEPS", 1, 1000, &c.max_steps));
  }
  if (auto v = Env("KEEL_LEASE_MS"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(SetInt(v, "KEEL_LEASE_MS", 1000, 3600000, &c.lease_ms));
  }
  if (auto v = Env("KEEL_DRAIN_TIMEOUT_MS"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(SetInt(v, "KEEL_DRAIN_TIMEOUT_MS", 0, 3600000, &c.drain_timeout_ms));
  }
  if (auto v = Env("KEEL_LARGE_RESULT_BYTES"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(SetInt(v, "KEEL_LARGE_RESULT_BYTES", 1024, int64_t(64) << 20,
                                &c.large_result_bytes));
  }
  if (auto v = Env("KEEL_APPROVAL_TIMEOUT_MS"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(SetInt(v, "KEEL_APPROVAL_TIMEOUT_MS", 1000, int64_t(365) * 86400000,
                                &c.approval_timeout_ms));
  }
  if (auto v = Env("KEEL_MAX_BODY_BYTES"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(SetInt(v, "KEEL_MAX_BODY_BYTES", 1024, int64_t(1) << 30, &c.max_body_bytes));
  }
  if (auto v = Env("KEEL_MAX_CONNECTIONS"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(
        SetInt(v, "KEEL_MAX_CONNECTIONS", 1, kMaxConnections, &http.max_connections));
  }
  if (auto v = Env("KEEL_MAX_CONNECTIONS_PER_ADDRESS"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(SetInt(v, "KEEL_MAX_CONNECTIONS_PER_ADDRESS", 1, kMaxConnections,
                                &http.max_connections_per_address));
  }
  if (auto v = Env("KEEL_HEADER_TIMEOUT_MS"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(
        SetInt(v, "KEEL_HEADER_TIMEOUT_MS", 100, kMaxHttpTimeoutMs, &http.header_timeout_ms));
  }
  if (auto v = Env("KEEL_BODY_TIMEOUT_MS"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(
        SetInt(v, "KEEL_BODY_TIMEOUT_MS", 100, kMaxHttpTimeoutMs, &http.body_timeout_ms));
  }
  if (auto v = Env("KEEL_IDLE_TIMEOUT_MS"); !v.empty()) {
    KEEL_RETURN_IF_ERROR(
        SetInt(v, "KEEL_IDLE_TIMEOUT_MS", 100, kMaxHttpTimeoutMs, &http.idle_timeout_ms));
  }
  // A comma-separated list, its items trimmed, empty ones dropped.
  auto comma_list = [](const std::string& v) {
    std::vector<std::string> out;
    size_t pos = 0;
    while (pos <= v.size()) {
      size_t comma = std::min(v.find(',', pos), v.size());
      std::string item = v.substr(pos, comma - pos);
      item.erase(0, item.find_first_not_of(" \t"));
      item.erase(item.find_last_not_of(" \t") + 1);
      if (!item.empty()) out.push_back(item);
      pos = comma + 1;
    }
    return out;
  };
  if (auto v = Env("KEEL_OUTBOUND_ALLOW"); !v.empty()) {
    c.outbound_allow = comma_list(v);
    KEEL_RETURN_IF_ERROR(CheckOutboundAllow("KEEL_OUTBOUND_ALLOW", c.outbound_allow));
  }
  if (auto v = Env("KEEL_PUBLIC_URL"); !v.empty()) c.public_url = v;
  while (!c.public_url.empty() && c.public_url.back() == '/') c.public_url.pop_back();
  if (!c.public_url.empty()) {
    bool printable = true;
    for (char ch : c.public_url) printable = printable && ch > 0x20 && ch < 0x7f;
    if (!printable || c.public_url.size() > 512 ||
        (c.public_url.rfind("https://", 0) != 0 && c.public_url.rfind("http://", 0) != 0) ||
        c.public_url.find_first_of("?#") != std::string::npos) {
      return InvalidArgument(
          "public_url (KEEL_PUBLIC_URL) must be an http:// or https:// URL "
          "without a query, at most 512 characters: the address the "
          "internet reaches this server at");
    }
  }
  if (auto v = Env("KEEL_CORS_ORIGINS"); !v.empty()) {
    c.cors_origins = comma_list(v);
    KEEL_RETURN_IF_ERROR(http::CheckCorsOrigins("KEEL_CORS_ORIGINS", c.cors_origins));
  }
  if (o.listen) c.listen = *o.listen;
  if (o.store_url) c.store_url = *o.store_url;

  if (c.store_url.empty()) c.store_url = "sqlite://" + c.home + "/keel.db";
  if (c.workspaces.empty()) c.workspaces = c.home + "/workspaces";
  KEEL_RETURN_IF_ERROR(ResolveShare("tenant_max_running", "max_concurrent_runs",
                                    c.max_concurrent_runs, &limits.tenant_max_running));
  KEEL_RETURN_IF_ERROR(ResolveShare("tenant_tool_threads", "tool_threads", limits.tool_threads,
                                    &limits.tenant_tool_threads));
  if (limits.io_stall_warn_ms >= limits.io_stall_limit_ms) {
    return InvalidArgument("io_stall_warn_ms (" + std::to_string(limits.io_stall_warn_ms) +
                           ") must be below io_stall_limit_ms (" +
                           std::to_string(limits.io_stall_limit_ms) + ")");
  }
  return Status::Ok();
}

}  // namespace

Result<Config> Load(const Overrides& o) {
  Config c;
  HttpConfig http;
  LimitsConfig limits;
  KEEL_RETURN_IF_ERROR(LoadInto(o, c, http, limits));
  return c;
}

Result<HttpConfig> LoadHttp(const Overrides& o) {
  Config c;
  HttpConfig http;
  LimitsConfig limits;
  KEEL_RETURN_IF_ERROR(LoadInto(o, c, http, limits));
  return http;
}

Result<LimitsConfig> LoadLimits(const Overrides& o) {
  Config c;
  HttpConfig http;
  LimitsConfig limits;
  KEEL_RETURN_IF_ERROR(LoadInto(o, c, http, limits));
  return limits;
}

void ForgetSecretKekInEnvironment() {
  static constexpr std::string_view kName = "KEEL_SECRET_KEK=";
  for (char** e = environ; e && *e; ++e) {
    if (std::string_view(*e).substr(0, kName.size()) != kName) continue;
    char* entry = *e;
    size_t length = std::strlen(entry);
    ::unsetenv("KEEL_SECRET_KEK");  // drops the pointer from environ, not the bytes
    // The bytes are the process's initial environment block, which /proc/PID/environ reads.
    volatile char* bytes = entry;
    for (size_t i = 0; i < length; ++i) bytes[i] = '\0';
    return;
  }
}

}  // namespace keel::config
