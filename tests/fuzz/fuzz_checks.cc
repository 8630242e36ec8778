#include "fuzz_checks.h"

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>

#include <exception>

#include "cron_fuzz_check.h"
#include "keel/common/json_util.h"
#include "keel/memory/query.h"
#include "keel/model/anthropic_wire.h"
#include "keel/model/openai_wire.h"
#include "keel/plugins/manifest.h"
#include "keel/policy/policy.h"
#include "keel/skills/skills.h"

namespace keel::fuzz {
namespace {

// A rejection must be a Status with a message, never an empty one.
std::string Rejected(const Status& st, const char* what) {
  if (st.ok()) return "";
  if (st.message().empty()) return std::string(what) + " rejected an input without a message";
  return "";
}

std::string CheckJson(std::string_view input) {
  auto parsed = ParseJson(input);
  if (!parsed.ok()) return Rejected(parsed.status(), "ParseJson");
  std::string dumped = DumpJson(*parsed);
  auto again = ParseJson(dumped);
  if (!again.ok()) return "the dump of an accepted value does not parse: " + again.status().message();
  if (DumpJson(*again) != dumped) return "an accepted value does not survive dump and parse";
  auto object = ParseJsonObject(input);
  if (object.ok() != parsed->is_object()) return "ParseJsonObject disagrees with ParseJson";
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

std::string CheckOpenAiStream(std::string_view input) {
  model::openai::ToolNameMap names;
  names.Encode("notes.append");
  names.Encode("mcp__fs__read_file");
  model::openai::ChatStreamAccumulator acc(names);
  bool failed = false;
  std::string broken = FeedEvents(input, [&](const model::openai::SseEvent& e) -> std::string {
    if (failed) return "";
    std::string delta;
    Status st = acc.Add(e.data, delta);
    failed = !st.ok();
    return Rejected(st, "ChatStreamAccumulator::Add");
  });
  if (!broken.empty() || failed) return broken;
  auto response = acc.Finish();
  return response.ok() ? "" : Rejected(response.status(), "ChatStreamAccumulator::Finish");
}

std::string CheckAnthropicStream(std::string_view input) {
  model::anthropic::ToolNameMap names;
  names.Encode("notes.append");
  names.Encode("mcp__fs__read_file");
  model::anthropic::MessageStreamAccumulator acc(names);
  bool failed = false;
  std::string broken = FeedEvents(input, [&](const model::openai::SseEvent& e) -> std::string {
    if (failed) return "";
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
