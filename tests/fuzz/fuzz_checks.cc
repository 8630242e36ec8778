#include "fuzz_checks.h"

#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/beast/_experimental/test/stream.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/websocket.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <fstream>
#include <memory>

#include "cron_fuzz_check.h"
#include "keel/common/json_util.h"
#include "keel/http/websocket.h"
#include "keel/mcp/messages.h"
#include "keel/memory/query.h"
#include "keel/model/anthropic_wire.h"
#include "keel/model/openai_wire.h"
#include "keel/plugins/manifest.h"
#include "keel/policy/policy.h"
#include "keel/skills/skills.h"
#include "keel/store/archive.h"

namespace keel::fuzz {
namespace {

// A rejection must be a Status with a message, never an empty one.
std::string Rejected(const Status& st, const char* what) {
  if (st.ok()) return "";
  if (st.message().empty()) return std::string(what) + " rejected an input without a message";
  return "";
}

// Whether a key or string of `j` holds a NUL character (j is at most ParseJson's depth limit deep).
bool HoldsNul(const Json& j) {
  auto nul = [](const std::string& s) { return s.find('\0') != std::string::npos; };
  if (j.is_string()) return nul(j.get_ref<const std::string&>());
  if (j.is_array()) return std::any_of(j.begin(), j.end(), HoldsNul);
  if (!j.is_object()) return false;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (nul(it.key()) || HoldsNul(it.value())) return true;
  }
  return false;
}

std::string CheckJson(std::string_view input) {
  auto parsed = ParseJson(input);
  if (!parsed.ok()) return Rejected(parsed.status(), "ParseJson");
  // The value is the one nlohmann's own parser builds from the text.
  Json reference = Json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (reference.is_discarded()) return "ParseJson accepted a text nlohmann's parser refuses";
  if (reference != *parsed) return "ParseJson built another value than nlohmann's parser";
  std::string dumped = DumpJson(*parsed);
  if (dumped != parsed->dump(-1, ' ', false, Json::error_handler_t::replace)) {
    return "DumpJson wrote another text than nlohmann's dump";
  }
  auto again = ParseJson(dumped);
  if (!again.ok()) return "the dump of an accepted value does not parse: " + again.status().message();
  if (DumpJson(*again) != dumped) return "an accepted value does not survive dump and parse";
  // A body is an object without NUL characters (ParseJsonObject refuses \u0000 in any string
  // or key); anything else ParseJson accepted it accepts too.
  auto object = ParseJsonObject(input);
  if (object.ok() != (parsed->is_object() && !HoldsNul(*parsed))) {
    return "ParseJsonObject disagrees with ParseJson";
  }
  return "";
}

std::string CheckPolicy(std::string_view input) {
  auto doc = ParseJson(input);
  if (!doc.ok()) return "";
  auto policy = policy::ParsePolicy(*doc);
  if (!policy.ok()) return Rejected(policy.status(), "ParsePolicy");
  Json canonical = policy::PolicyJson(*policy);
  auto again = policy::ParsePolicy(canonical);
  if (!again.ok()) return "the canonical form of a policy is refused: " + again.status().message();
  if (policy::PolicyJson(*again) != canonical) return "PolicyJson is not a fixed point";
  return "";
}

std::string CheckManifest(std::string_view input) {
  auto doc = ParseJson(input);
  if (!doc.ok()) return "";
  auto manifest = plugins::ParseManifest(*doc);
  if (!manifest.ok()) return Rejected(manifest.status(), "ParseManifest");
  return "";
}

std::string CheckMemoryQuery(std::string_view input) {
  auto query = memory::ParseQuery(input);
  if (!query.ok()) {
    if (query.status().code() != Code::kInvalidArgument) {
      return "a refused memory query must be invalid_argument";
    }
    return Rejected(query.status(), "ParseQuery");
  }
  return "";
}

std::string CheckFrontMatter(std::string_view input) {
  auto fm = skills::ParseFrontMatter(input);
  if (!fm.ok()) return Rejected(fm.status(), "ParseFrontMatter");
  return "";
}

// Feeds `input` to the SSE parser in three pieces (so lines split across reads) and hands each
// event to `add`; then the end of the stream.
template <typename Add>
std::string FeedEvents(std::string_view input, Add add) {
  model::openai::SseParser parser;
  std::vector<model::openai::SseEvent> events;
  size_t a = input.size() / 3, b = 2 * input.size() / 3;
  for (std::string_view piece : {input.substr(0, a), input.substr(a, b - a), input.substr(b)}) {
    Status st = parser.Feed(piece, events);
    if (!st.ok()) return Rejected(st, "SseParser");
    for (const auto& e : events) {
      if (std::string broken = add(e); !broken.empty()) return broken;
    }
    events.clear();
  }
  if (auto last = parser.Finish()) return add(*last);
  return "";
}

// A chunk ReadTextChunk reads must say what the full path (ParseJson) reads in it: the same
// content and finish_reason, from a text ParseJson accepts but for a key given twice.
std::string CheckTextChunk(std::string_view data) {
  auto quick = model::openai::ReadTextChunk(data);
  if (!quick) return "";
  auto full = ParseJson(data);
  if (!full.ok()) {
    if (full.status().message().find("appears twice") != std::string::npos) return "";
    return "ReadTextChunk read a chunk ParseJson refuses: " + full.status().message();
  }
  std::string content;
  std::optional<std::string> finish;
  auto choices = full->find("choices");
  if (choices != full->end() && choices->is_array() && !choices->empty()) {
    const Json& choice = choices->at(0);
    if (auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
      if (auto c = d->find("content"); c != d->end() && c->is_string()) content = *c;
    }
    if (auto r = choice.find("finish_reason"); r != choice.end() && r->is_string()) finish = *r;
  }
  if (quick->content != content) return "ReadTextChunk read another content than ParseJson";
  if (quick->finish_reason != finish) return "ReadTextChunk read another finish_reason";
  // The usage as the full path reads it: an integer count, negative as 0; anything else 0.
  auto usage = full->find("usage");
  const bool has_usage = usage != full->end() && usage->is_object();
  if (quick->usage.has_value() != has_usage) return "ReadTextChunk read the usage otherwise";
  if (has_usage) {
    auto count = [&](const char* field) -> int64_t {
      auto v = usage->find(field);
      if (v == usage->end()) return 0;
      if (v->is_number_unsigned()) {
        return static_cast<int64_t>(std::min<uint64_t>(v->get<uint64_t>(), INT64_MAX));
      }
      return v->is_number_integer() ? std::max<int64_t>(0, v->get<int64_t>()) : 0;
    };
    if (quick->usage->input_tokens != count("prompt_tokens") ||
        quick->usage->output_tokens != count("completion_tokens")) {
      return "ReadTextChunk read other token counts than the full path";
    }
  }
  return "";
}

std::string CheckOpenAiStream(std::string_view input) {
  model::openai::ToolNameMap names;
  names.Encode("notes.append");
  names.Encode("mcp__fs__read_file");
  model::openai::ChatStreamAccumulator acc(names);
  bool failed = false;
  std::string broken = FeedEvents(input, [&](const model::openai::SseEvent& e) -> std::string {
    if (failed) return "";
    if (std::string broken = CheckTextChunk(e.data); !broken.empty()) return broken;
    std::string delta;
    Status st = acc.Add(e.data, delta);
    failed = !st.ok();
    return Rejected(st, "ChatStreamAccumulator::Add");
  });
  if (!broken.empty() || failed) return broken;
  auto response = acc.Finish();
  return response.ok() ? "" : Rejected(response.status(), "ChatStreamAccumulator::Finish");
}

// An event ReadTextDelta reads must say what the full path (ParseJson) reads in it: a
// content_block_delta with a text_delta, its index and its text, from a text ParseJson accepts
// but for a key given twice.
std::string CheckTextDelta(const model::openai::SseEvent& e) {
  auto quick = model::anthropic::ReadTextDelta(e.data, e.event);
  if (!quick) return "";
  auto full = ParseJson(e.data);
  if (!full.ok()) {
    if (full.status().message().find("appears twice") != std::string::npos) return "";
    return "ReadTextDelta read an event ParseJson refuses: " + full.status().message();
  }
  if (!full->is_object()) return "ReadTextDelta read an event that is not an object";
  std::string type = full->contains("type") && (*full)["type"].is_string()
                         ? (*full)["type"].get<std::string>()
                         : "";
  if (type.empty()) type = e.event;
  if (type != "content_block_delta") return "ReadTextDelta read another event type";
  const Json& index = full->at("index");
  if (!index.is_number_integer()) return "ReadTextDelta read an index that is not an integer";
  int64_t expected =
      index.is_number_unsigned()
          ? static_cast<int64_t>(std::min<uint64_t>(index.get<uint64_t>(), INT64_MAX))
          : index.get<int64_t>();
  if (quick->index != expected) return "ReadTextDelta read another index";
  const Json& d = full->at("delta");
  if (d.value("type", Json()) != "text_delta" || !d.at("text").is_string() ||
      d.at("text").get<std::string>() != quick->text) {
    return "ReadTextDelta read another delta than ParseJson";
  }
  return "";
}

std::string CheckAnthropicStream(std::string_view input) {
  model::anthropic::ToolNameMap names;
  names.Encode("notes.append");
  names.Encode("mcp__fs__read_file");
  model::anthropic::MessageStreamAccumulator acc(names);
  bool failed = false;
  std::string broken = FeedEvents(input, [&](const model::openai::SseEvent& e) -> std::string {
    if (failed) return "";
    if (std::string broken = CheckTextDelta(e); !broken.empty()) return broken;
    std::string delta;
    Status st = acc.Add(e, delta);
    failed = !st.ok();
    return Rejected(st, "MessageStreamAccumulator::Add");
  });
  if (!broken.empty() || failed) return broken;
  auto response = acc.Finish();
  return response.ok() ? "" : Rejected(response.status(), "MessageStreamAccumulator::Finish");
}

std::string CheckOpenAiBody(std::string_view input) {
  model::openai::ToolNameMap names;
  names.Encode("notes.append");
  auto response = model::openai::ParseChatCompletion(input, names);
  return response.ok() ? "" : Rejected(response.status(), "ParseChatCompletion");
}

std::string CheckAnthropicBody(std::string_view input) {
  model::anthropic::ToolNameMap names;
  names.Encode("notes.append");
  auto response = model::anthropic::ParseMessage(input, names);
  return response.ok() ? "" : Rejected(response.status(), "ParseMessage");
}

// The request framing of the HTTP server: Beast's parser with the server's limits (64 KiB of
// head, 1 MiB of body), fed in two pieces, then the body as a request body.
std::string CheckHttpRequest(std::string_view input) {
  namespace bhttp = boost::beast::http;
  bhttp::request_parser<bhttp::string_body> parser;
  parser.header_limit(64 * 1024);
  parser.body_limit(1 << 20);
  parser.eager(true);
  boost::system::error_code ec;
  size_t used = 0;
  for (size_t cut : {input.size() / 2, input.size()}) {
    while (used < cut && !ec && !parser.is_done()) {
      used += parser.put(boost::asio::buffer(input.data() + used, cut - used), ec);
      if (ec == bhttp::error::need_more) {
        ec = {};
        break;
      }
    }
  }
  if (!ec && parser.is_done()) {
    auto body = ParseJson(parser.get().body());
    if (!body.ok()) return Rejected(body.status(), "ParseJson of a request body");
  }
  return "";
}

std::string CheckCron(std::string_view input) { return schedule::CheckCronInput(input); }

// MCP in both directions: `input` as a message a client posts to Keel's endpoint, and (when it
// is JSON) as what a server answers Keel's client: a tools/list page and a tools/call result.
std::string CheckMcpMessage(std::string_view input) {
  mcp::PostedMessage posted = mcp::ParsePostedMessage(input);
  if (posted.error_code != 0 && posted.error.empty()) return "a posted message refused without a message";
  if (posted.error_code == 0 && posted.has_id && !posted.id.is_string() &&
      !posted.id.is_number_integer()) {
    return "a posted message accepted with an id that is neither a string nor an integer";
  }
  auto parsed = ParseJson(input);
  if (!parsed.ok()) return "";
  std::vector<mcp::McpTool> tools;
  std::string cursor;
  Status page = mcp::ReadToolsPage(*parsed, tools, cursor);
  if (!page.ok()) return Rejected(page, "ReadToolsPage");
  for (const auto& t : tools) {
    if (t.name.empty()) return "a listed tool without a name was accepted";
    if (!t.input_schema.is_object()) return "a listed tool's input schema is not an object";
  }
  return Rejected(mcp::CheckCallResult(*parsed), "CheckCallResult");
}

// The frames a WebSocket client sends after a valid upgrade, read with the server's limits
// (http/websocket.cc) until the client's bytes end.
std::string CheckWebSocketFrames(std::string_view input) {
  namespace beast = boost::beast;
  namespace websocket = beast::websocket;
  boost::asio::io_context ioc;
  beast::test::stream client(ioc), server(ioc);
  client.connect(server);
  websocket::stream<beast::test::stream&> ws(server);
  ws.read_message_max(http::kMaxWebSocketClientMessage);
  beast::http::request<beast::http::string_body> upgrade{beast::http::verb::get, "/v1/stream", 11};
  upgrade.set(beast::http::field::host, "127.0.0.1");
  upgrade.set(beast::http::field::upgrade, "websocket");
  upgrade.set(beast::http::field::connection, "upgrade");
  upgrade.set(beast::http::field::sec_websocket_key, "dGhlIHNhbXBsZSBub25jZQ==");
  upgrade.set(beast::http::field::sec_websocket_version, "13");
  boost::system::error_code ec;
  ws.accept(upgrade, ec);
  if (ec) return "a valid upgrade was refused: " + ec.message();
  server.append({input.data(), input.size()});
  client.close();  // the client's bytes end here
  beast::flat_buffer buffer;
  for (int messages = 0; messages < 100000 && !ec; ++messages) {
    ws.read(buffer, ec);
    if (!ec && buffer.size() > http::kMaxWebSocketClientMessage) {
      return "a message over the server's limit was read";
    }
    buffer.consume(buffer.size());
  }
  return "";
}

// An export archive given to `keel import`: refused with a message, or imported into an
// empty SQLite store.
std::string CheckArchive(std::string_view input) {
  static std::string dir = [] {
    char tmpl[] = "/tmp/keel-fuzz-archive-XXXXXX";
    const char* made = mkdtemp(tmpl);
    return std::string(made ? made : "/tmp");
  }();
  static int fresh = 0;
  static std::unique_ptr<store::Store> target;
  if (!target) {
    std::string db = dir + "/keel-" + std::to_string(fresh++) + ".db";
    auto opened = store::OpenStore("sqlite://" + db, store::StoreOptions{"fuzz-origin"});
    if (!opened.ok()) return "cannot open a store for the archive target: " + opened.status().message();
    target = std::move(*opened);
  }
  std::string path = dir + "/input.keel";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(input.data(), static_cast<std::streamsize>(input.size()));
  }
  Status st = store::ImportArchive(*target, path);
  if (st.ok()) {  // the store now holds data: the next input gets a fresh one
    target->Close();
    target.reset();
    return "";
  }
  if (st.code() != Code::kInvalidArgument) {
    return "an archive refused with " + st.ToString() + " (not invalid_argument)";
  }
  return Rejected(st, "ImportArchive");
}

const std::vector<Target> kTargets = {
    {"json", CheckJson},
    {"policy", CheckPolicy},
    {"manifest", CheckManifest},
    {"memory_query", CheckMemoryQuery},
    {"skill_front_matter", CheckFrontMatter},
    {"openai_stream", CheckOpenAiStream},
    {"anthropic_stream", CheckAnthropicStream},
    {"openai_body", CheckOpenAiBody},
    {"anthropic_body", CheckAnthropicBody},
    {"http_request", CheckHttpRequest},
    {"cron", CheckCron},
    {"mcp_message", CheckMcpMessage},
    {"websocket_frames", CheckWebSocketFrames},
    {"archive", CheckArchive},
};

}  // namespace

const std::vector<Target>& Targets() { return kTargets; }

const Target* FindTarget(std::string_view name) {
  for (const auto& t : kTargets) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

std::string RunCheck(const Target& target, std::string_view input) {
  try {
    return target.check(input);
  } catch (const std::exception& e) {
    return std::string("threw: ") + e.what();
  } catch (...) {
    return "threw something that is not a std::exception";
  }
}

}  // namespace keel::fuzz
