#pragma once
// Model providers: the one interface the runtime calls for a model turn. A provider receives
// the assembled conversation and the tools the agent may call, streams text deltas as they
// arrive, and returns the complete response with its tool calls and token usage.
//
// Providers run on the server's io executor; Complete is a coroutine. Model output is
// untrusted input: providers validate what they parse and fail with a Status, never assert.

#include <boost/asio/awaitable.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"

namespace keel::model {

struct ToolCallRequest {
  std::string id;    // provider's call id (generated when the provider has none)
  std::string name;  // Keel's tool name, e.g. "notes.append"
  Json arguments = Json::object();
};

struct ChatMessage {
  std::string role;  // system | user | assistant | tool
  std::string content;
  std::vector<ToolCallRequest> tool_calls;  // role == assistant
  std::string tool_call_id;                 // role == tool
  std::string tool_name;                    // role == tool
};

struct ToolSpec {
  std::string name;  // Keel's dotted name
  std::string description;
  Json parameters = Json::object();  // JSON Schema of the arguments
};

struct ModelRequest {
  std::string model;  // provider-specific model name ("gpt-4o-mini"; "local")
  std::vector<ChatMessage> messages;
  std::vector<ToolSpec> tools;
  Json agent_config = Json::object();  // the agent's config (local_rules, temperature, ...)
};

struct Usage {
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
};

struct ModelResponse {
  std::string text;
  std::vector<ToolCallRequest> tool_calls;
  Usage usage;
};

// Receives text deltas as they stream in.
using DeltaSink = std::function<void(const std::string& delta)>;

class Provider {
 public:
  virtual ~Provider() = default;
  virtual boost::asio::awaitable<Result<ModelResponse>> Complete(const ModelRequest& request,
                                                                 DeltaSink on_delta) = 0;
};

// Providers by name ("local", "openai"), owned by the server instance.
class ProviderRegistry {
 public:
  // kInvalidArgument on a duplicate name.
  Status Register(const std::string& name, std::unique_ptr<Provider> provider);
  // Resolves an agent's model string: "local" or "PROVIDER/MODEL". Sets *model_name to the part
  // the provider sees. kInvalidArgument naming the problem when unknown.
  Result<Provider*> Resolve(const std::string& model, std::string* model_name) const;
  bool Has(const std::string& name) const { return providers_.count(name) > 0; }

 private:
  std::map<std::string, std::unique_ptr<Provider>> providers_;
};

}  // namespace keel::model
