#include "keel/mcp/manager.h"

#include <algorithm>

namespace keel::mcp {

McpManager::~McpManager() {
  std::lock_guard<std::mutex> lock(mu_);
  entries_.clear();  // each client's destructor shuts its server down
}

std::shared_ptr<McpManager::Entry> McpManager::EntryFor(const ServerLaunch& launch) {
  std::lock_guard<std::mutex> lock(mu_);
  tenant_of_[launch.server_id] = launch.tenant_id;
  auto& e = entries_[launch.server_id];
  if (!e) e = std::make_shared<Entry>();
  return e;
}

Result<std::shared_ptr<McpSession>> McpManager::Connect(Entry& e, const ServerLaunch& launch) {
  // REQUIRES: e.mu held.
  if (e.client && e.client->alive() && e.fingerprint == launch.fingerprint) return e.client;
  e.client.reset();
  e.have_tools = false;
  Result<std::shared_ptr<McpSession>> started = Internal("unknown transport " + launch.transport);
  if (launch.transport == "http") {
    auto c = McpHttpClient::Connect(launch.http, launch.options, outbound_);
    started = c.ok() ? Result<std::shared_ptr<McpSession>>(std::shared_ptr<McpSession>(std::move(c).value()))
                     : Result<std::shared_ptr<McpSession>>(c.status());
  } else {
    auto c = McpClient::StartStdio(launch.spec, launch.options);
    started = c.ok() ? Result<std::shared_ptr<McpSession>>(std::shared_ptr<McpSession>(std::move(c).value()))
                     : Result<std::shared_ptr<McpSession>>(c.status());
  }
  if (!started.ok()) {
    Status failed = launch.redactor.Error(started.status());
    e.last_error = failed.message();
    return failed;
  }
  e.client = std::move(started).value();
  e.fingerprint = launch.fingerprint;
  e.last_error.clear();
  return e.client;
}

Result<std::vector<McpTool>> McpManager::Tools(const ServerLaunch& launch) {
  auto entry = EntryFor(launch);
  std::lock_guard<std::mutex> lock(entry->mu);
  KEEL_ASSIGN_OR_RETURN(auto client, Connect(*entry, launch));
  if (entry->have_tools && !client->tools_changed()) return entry->tools;
  auto listed = client->ListTools();
  if (!listed.ok()) {
    Status failed = launch.redactor.Error(listed.status());
    entry->last_error = failed.message();
    return failed;
  }
  entry->tools = std::move(listed).value();
  for (McpTool& t : entry->tools) {
    t.name = launch.redactor.Text(std::move(t.name));
    t.description = launch.redactor.Text(std::move(t.description));
    t.title = launch.redactor.Text(std::move(t.title));
    t.input_schema = launch.redactor.Value(std::move(t.input_schema));
    t.annotations = launch.redactor.Value(std::move(t.annotations));
  }
  entry->have_tools = true;
  return entry->tools;
}

Result<Json> McpManager::Call(const ServerLaunch& launch, const std::string& tool,
                              const Json& arguments, int64_t timeout_ms) {
  auto entry = EntryFor(launch);
  std::shared_ptr<McpSession> client;
  {
    std::lock_guard<std::mutex> lock(entry->mu);
    KEEL_ASSIGN_OR_RETURN(client, Connect(*entry, launch));
  }
  // The call itself runs without the entry's lock: calls to one server proceed concurrently.
  auto result = client->CallTool(tool, arguments, timeout_ms);
  if (!result.ok()) return launch.redactor.Error(result.status());
  return launch.redactor.Value(std::move(result).value());
}

void McpManager::Forget(const std::string& server_id) {
  std::shared_ptr<Entry> gone;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(server_id);
    if (it == entries_.end()) return;
    gone = std::move(it->second);
    entries_.erase(it);
    tenant_of_.erase(server_id);
  }
  std::lock_guard<std::mutex> lock(gone->mu);
  gone->client.reset();
}

std::vector<std::string> McpManager::Stale(const std::string& tenant_id,
                                           const std::vector<std::string>& registered) {
  std::vector<std::string> stale;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, tenant] : tenant_of_) {
    if (tenant == tenant_id && entries_.count(id) &&
        std::find(registered.begin(), registered.end(), id) == registered.end()) {
      stale.push_back(id);
    }
  }
  return stale;
}

std::string McpManager::StatusOf(const std::string& server_id) {
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = entries_.find(server_id);
    if (it == entries_.end()) return "not_connected";
    e = it->second;
  }
  std::lock_guard<std::mutex> lock(e->mu);
  if (e->client && e->client->alive()) return "ready";
  if (!e->last_error.empty()) return "error: " + e->last_error;
  return "not_connected";
}

}  // namespace keel::mcp
