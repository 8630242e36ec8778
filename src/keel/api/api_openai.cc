// The OpenAI-compatible front door: POST /v1/chat/completions talks to an agent (named by the
// request's `model`) as a Chat Completions model, and GET /v1/models lists the agents a token
// may talk to. A turn through it is a turn of a session like any other: the message goes
// through intake, the run through the gateway, and the answer comes back in the Chat
// Completions shape (docs/OPENAI.md).

#include <algorithm>
#include <chrono>

#include "keel/access/access.h"
#include "keel/access/users.h"
#include "keel/api/api.h"
#include "keel/api/render.h"
#include "keel/api/run_wait.h"
#include "keel/common/ids.h"
#include "keel/common/time.h"
#include "keel/runs/open_session.h"
#include "keel/runtime/event_hub.h"
#include "keel/runtime/runtime.h"
#include "keel/store/async.h"
#include "keel/store/row_images.h"

namespace keel::api {

namespace asio = boost::asio;
using http::Request;
using http::Response;

namespace {

// The header that names the session a conversation continues in (request), and the session a
// turn ran in (response).
constexpr const char* kSessionHeader = "X-Keel-Session";
constexpr double kDefaultWaitSeconds = 300;
constexpr double kMaxWaitSeconds = 3600;
constexpr size_t kMaxMessages = 10000;

const char* ErrorType(Code code) {
  switch (code) {
    case Code::kUnauthenticated:
      return "authentication_error";
    case Code::kPermissionDenied:
      return "permission_error";
    case Code::kNotFound:
      return "not_found_error";
    case Code::kRateLimited:
      return "rate_limit_error";
    case Code::kUnavailable:
    case Code::kInternal:
      return "server_error";
    default:
      return "invalid_request_error";
  }
}

// OpenAI's error shape: {"error": {"message", "type", "param", "code"}}; an empty param or
// code is null. (Strings, not Json: a string literal bound to a Json parameter inside a
// coroutine's co_return does not compile with g++ 12.)
Response OpenAiError(int http_status, const std::string& message, const std::string& type,
                     const std::string& param, const std::string& code) {
  auto or_null = [](const std::string& s) { return s.empty() ? Json() : Json(s); };
  Response r = Response::Json(http_status, {{"error",
                                             {{"message", message},
                                              {"type", type},
                                              {"param", or_null(param)},
                                              {"code", or_null(code)}}}});
  if (http_status == 401) r.headers["WWW-Authenticate"] = "Bearer";
  return r;
}

Response OpenAiErrorOf(const Status& status) {
  return OpenAiError(HttpStatusOf(status.code()), status.message(), ErrorType(status.code()), "",
                     std::string(CodeName(status.code())));
}

// After the message was posted, a client must not send it again: the OpenAI SDKs retry 408,
// 409, 429 and 5xx unless the answer says not to.
Response NotRetried(Response r) {
  r.headers["x-should-retry"] = "false";
  return r;
}

Response BadRequest(const std::string& message, const std::string& param) {
  return OpenAiError(400, message, "invalid_request_error", param, "");
}

// What a request asks of the agent, validated.
struct ChatRequest {
  std::string model;         // as given (echoed in the answer)
  std::string agent;         // the agent's id or name
  std::string instructions;  // the client's system and developer messages
  std::vector<std::pair<std::string, std::string>> history;  // role, text: before the turn
  std::string prompt;                                        // the last user message: the turn
  bool stream = false;
  bool include_usage = false;
};

bool NullOr(const Json& body, const char* field) {
  return !body.contains(field) || body[field].is_null();
}

// A message's text: a string, or an array of text parts (joined as OpenAI joins them).
Result<std::string> TextOf(const Json& content, size_t i) {
  const std::string where = "messages[" + std::to_string(i) + "].content";
  if (content.is_string()) return content.get<std::string>();
  if (content.is_null()) return std::string();
  if (!content.is_array()) {
    return InvalidArgument(where + " must be a string or an array of text parts");
  }
  std::string out;
  for (const auto& part : content) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      return InvalidArgument(where + " has a part without a type");
    }
    const std::string& type = part["type"].get_ref<const std::string&>();
    if (type != "text") {
      return InvalidArgument(where + " has a part of type '" + type +
                             "': Keel's agents take text only");
    }
    if (!part.contains("text") || !part["text"].is_string()) {
      return InvalidArgument(where + " has a text part without text");
    }
    if (!out.empty()) out += "\n";
    out += part["text"].get<std::string>();
  }
  return out;
}

// Parses and validates the body. Options a Keel agent cannot honour are refused, naming them;
// sampling hints (temperature, max_tokens, seed...) are the agent's configuration's to decide
// and unknown fields are ignored, as OpenAI-compatible servers do.
Result<ChatRequest> ParseChatRequest(const Json& body, std::string* param) {
  ChatRequest out;
  auto fail = [&](const std::string& field, const std::string& message) {
    *param = field;
    return InvalidArgument(message);
  };
  if (!body.contains("model") || !body["model"].is_string() ||
      body["model"].get_ref<const std::string&>().empty()) {
    return fail("model", "'model' must name an agent: \"agent:NAME\", \"NAME\" or its id");
  }
  out.model = body["model"].get<std::string>();
  out.agent = out.model.rfind("agent:", 0) == 0 ? out.model.substr(6) : out.model;
  if (body.contains("stream") && !body["stream"].is_null()) {
    if (!body["stream"].is_boolean()) return fail("stream", "'stream' must be a boolean");
    out.stream = body["stream"].get<bool>();
  }
  if (!NullOr(body, "stream_options")) {
    const Json& o = body["stream_options"];
    if (!o.is_object()) return fail("stream_options", "'stream_options' must be an object");
    if (o.contains("include_usage") && !o["include_usage"].is_null()) {
      if (!o["include_usage"].is_boolean()) {
        return fail("stream_options", "'stream_options.include_usage' must be a boolean");
      }
      out.include_usage = o["include_usage"].get<bool>();
    }
  }
  // What a Keel agent cannot do for a request: its tools and answers are its own.
  auto empty_array = [&](const char* f) {
    return NullOr(body, f) || (body[f].is_array() && body[f].empty());
  };
  if (!empty_array("tools") || !empty_array("functions")) {
    return fail(body.contains("tools") ? "tools" : "functions",
                "request tools are not supported: the agent calls its own tools (configure them "
                "on the agent), and Keel runs them");
  }
  if (!NullOr(body, "tool_choice") &&
      !(body["tool_choice"].is_string() &&
        (body["tool_choice"] == "none" || body["tool_choice"] == "auto"))) {
    return fail("tool_choice", "'tool_choice' other than \"auto\" or \"none\" is not supported");
  }
  if (!NullOr(body, "n") && !(body["n"].is_number_integer() && body["n"].get<int64_t>() == 1)) {
    return fail("n", "'n' must be 1: an agent gives one answer per turn");
  }
  if (!NullOr(body, "response_format") && !(body["response_format"].is_object() &&
                                            body["response_format"].value("type", "") == "text")) {
    return fail("response_format",
                "'response_format' other than {\"type\": \"text\"} is not supported");
  }
  if (!NullOr(body, "logprobs") &&
      !(body["logprobs"].is_boolean() && !body["logprobs"].get<bool>())) {
    return fail("logprobs", "'logprobs' is not supported");
  }
  if (!NullOr(body, "top_logprobs") &&
      !(body["top_logprobs"].is_number_integer() && body["top_logprobs"].get<int64_t>() == 0)) {
    return fail("top_logprobs", "'top_logprobs' is not supported");
  }
  if (!empty_array("stop") &&
      !(body["stop"].is_string() && body["stop"].get_ref<const std::string&>().empty())) {
    return fail("stop", "'stop' sequences are not supported");
  }
  if (!NullOr(body, "audio") || !NullOr(body, "prediction")) {
    return fail(NullOr(body, "audio") ? "prediction" : "audio",
                "audio output and predicted outputs are not supported");
  }
  if (!NullOr(body, "modalities") &&
      !(body["modalities"].is_array() && body["modalities"].size() == 1 &&
        body["modalities"][0] == "text")) {
    return fail("modalities", "only the \"text\" modality is supported");
  }

  if (!body.contains("messages") || !body["messages"].is_array() || body["messages"].empty()) {
    return fail("messages", "'messages' must be a non-empty array");
  }
  const Json& messages = body["messages"];
  if (messages.size() > kMaxMessages) {
    return fail("messages",
                "'messages' has more than " + std::to_string(kMaxMessages) + " messages");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const Json& m = messages[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      return fail(at, at + " must be an object with a 'role'");
    }
    const std::string& role = m["role"].get_ref<const std::string&>();
    if (role != "system" && role != "developer" && role != "user" && role != "assistant") {
      return fail(at + ".role", at + " has role '" + role +
                                    "': Keel takes system, developer, user and assistant "
                                    "messages (the agent runs its own tools)");
    }
    if (role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null() &&
        !(m["tool_calls"].is_array() && m["tool_calls"].empty())) {
      return fail(at + ".tool_calls", at + " has tool calls: the agent runs its own tools");
    }
    auto text = TextOf(m.contains("content") ? m["content"] : Json(), i);
    if (!text.ok()) return fail(at + ".content", text.status().message());
    if (role == "system" || role == "developer") {
      if (!text->empty()) {
        if (!out.instructions.empty()) out.instructions += "\n\n";
        out.instructions += *text;
      }
    } else {
      out.history.emplace_back(role, std::move(*text));
    }
  }
  if (out.history.empty() || out.history.back().first != "user" ||
      out.history.back().second.empty()) {
    return fail("messages", "the last message must be the user's, with text: it is the turn");
  }
  if (out.instructions.size() > kMaxSessionInstructions) {
    return fail("messages", "the system messages are longer than 256 KiB together");
  }
  out.prompt = std::move(out.history.back().second);
  out.history.pop_back();
  return out;
}

// The agent a model string names: by id, or by name.
Result<store::Agent> AgentNamed(store::Tx& tx, const http::Principal& who,
                                const std::string& name) {
  Result<store::Agent> found = NotFound("agent not found: " + name);
  if (IsUuid(name)) found = tx.agents().GetAgent(who.tenant_id, name);
  if (found.status().code() == Code::kNotFound) {
    found = tx.agents().GetAgentByName(who.tenant_id, name);
  }
  if (!found.ok()) return found;
  // A person's token reaches only the agents the person may talk to.
  if (Status st = access::Reachable(tx, who.tenant_id, who.user_id, found->id); !st.ok()) {
    if (st.code() == Code::kNotFound) return NotFound("agent not found: " + name);
    return st;
  }
  return found;
}

// A session's title from its first words (at most 80 bytes, cut between characters).
std::string TitleOf(const std::string& text) {
  std::string t = text.substr(0, text.find('\n'));
  if (t.size() > 80) {
    size_t cut = 80;
    while (cut > 0 && (static_cast<unsigned char>(t[cut]) & 0xC0) == 0x80) --cut;
    t = t.substr(0, cut);
  }
  return t;
}

int64_t Seconds(Millis ms) { return ms / 1000; }

Json ChunkJson(const std::string& id, int64_t created, const std::string& model, Json delta,
               const Json& finish_reason) {
  Json choice = {{"index", 0},
                 {"delta", std::move(delta)},
                 {"logprobs", nullptr},
                 {"finish_reason", finish_reason}};
  return {
      {"id", id},       {"object", "chat.completion.chunk"}, {"created", created},
      {"model", model}, {"system_fingerprint", nullptr},     {"choices", Json::array({choice})}};
}

Json UsageJson(const store::Run& run) {
  return {{"prompt_tokens", run.input_tokens},
          {"completion_tokens", run.output_tokens},
          {"total_tokens", run.input_tokens + run.output_tokens}};
}

std::string SseData(const Json& j) { return "data: " + DumpJson(j) + "\n\n"; }

Json RoleDelta() { return {{"role", "assistant"}, {"content", ""}}; }

// A run that did not end done, as an OpenAI error (nullopt when it did).
std::optional<Response> RunFailure(const store::Run& run, double waited) {
  if (run.status == "done") return std::nullopt;
  const std::string follow = "; follow it at GET /v1/runs/" + run.id;
  if (!run.Terminal()) {
    return NotRetried(OpenAiError(
        504,
        "run " + run.id + " is still " + run.status + " after " +
            std::to_string(static_cast<int64_t>(waited)) + " s (X-Keel-Wait sets the wait)" +
            follow,
        "timeout", "", run.status == "waiting_for_approval" ? "approval_pending" : "timeout"));
  }
  std::string code = run.error.is_object() ? run.error.value("code", "") : "";
  std::string message = run.error.is_object() ? run.error.value("message", "") : "";
  if (run.status == "cancelled") {
    return NotRetried(OpenAiError(409, "run " + run.id + " was cancelled", "invalid_request_error",
                                  "", "cancelled"));
  }
  const std::string text = "run " + run.id + " failed (" + code + "): " + message;
  if (code == "budget_exceeded") {
    return NotRetried(OpenAiError(429, text, "insufficient_quota", "", "insufficient_quota"));
  }
  if (code == "permission_denied" || code == "policy_denied") {
    return NotRetried(OpenAiError(403, text, "permission_error", "", code));
  }
  return NotRetried(OpenAiError(500, text, "server_error", "", code));
}

Json ErrorChunk(const Response& failure) {
  auto parsed = ParseJson(failure.body);
  return parsed.ok() ? *parsed : Json{{"error", {{"message", "the run failed"}}}};
}

}  // namespace

void RegisterOpenAiRoutes(http::Router& router, ApiContext& ctx) {
  router.Add(
      "POST", "/v1/chat/completions",
      [&ctx](Request& req) -> asio::awaitable<Response> {
        auto body = ParseJsonObject(req.body);
        if (!body.ok()) co_return BadRequest(body.status().message(), "");
        std::string param;
        auto chat = ParseChatRequest(*body, &param);
        if (!chat.ok()) co_return BadRequest(chat.status().message(), param);
        double wait = kDefaultWaitSeconds;
        if (std::string w = req.Header("x-keel-wait"); !w.empty()) {
          char* end = nullptr;
          wait = std::strtod(w.c_str(), &end);
          if (end != w.c_str() + w.size() || !(wait > 0 && wait <= kMaxWaitSeconds)) {
            co_return BadRequest("X-Keel-Wait must be a number of seconds from 0 to 3600", "");
          }
        }
        const http::Principal& who = req.principal;
        const std::string continued = req.Header("x-keel-session");

        // The agent, and the session the conversation continues in (one its caller opened).
        store::Agent agent;
        store::Session session;
        Status read = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
          auto found = AgentNamed(tx, who, chat->agent);
          if (!found.ok()) return found.status();
          agent = std::move(*found);
          if (continued.empty()) return Status::Ok();
          auto s = tx.sessions().GetSession(who.tenant_id, continued);
          if (!s.ok() && s.status().code() != Code::kNotFound) return s.status();
          if (!s.ok() || s->created_by != who.token_id || s->agent_id != agent.id ||
              !access::CanUseSession(who, *s)) {
            return InvalidArgument("session " + continued + " is not a session of agent '" +
                                   chat->model + "' opened with this token");
          }
          session = std::move(*s);
          return Status::Ok();
        });
        if (!read.ok()) {
          if (read.code() == Code::kNotFound) {
            co_return OpenAiError(404,
                                  "The model '" + chat->model +
                                      "' does not exist or you do not have access to it: it "
                                      "names no agent of this tenant (GET /v1/models lists them)",
                                  "invalid_request_error", "model", "model_not_found");
          }
          if (read.code() == Code::kInvalidArgument) {
            co_return OpenAiError(404, read.message(), "invalid_request_error", kSessionHeader,
                                  "session_not_found");
          }
          co_return OpenAiErrorOf(read);
        }

        // A new session, seeded with the conversation before its last message.
        if (continued.empty()) {
          session.id = NewId();
          session.tenant_id = who.tenant_id;
          session.agent_id = agent.id;
          session.title = TitleOf(chat->history.empty() ? chat->prompt : chat->history[0].second);
          session.instructions = chat->instructions;
          session.created_by = who.token_id;
          session.created_at = session.updated_at = NowMillis();
          auto opened = co_await store::AsyncWrite(ctx.store, [&](store::Tx& tx) -> Status {
            KEEL_RETURN_IF_ERROR(tx.agents().GetAgent(session.tenant_id, agent.id).status());
            KEEL_RETURN_IF_ERROR(runs::OpenSession(tx, session));
            for (const auto& [role, text] : chat->history) {
              store::Message m;
              m.id = NewId();
              m.tenant_id = session.tenant_id;
              m.session_id = session.id;
              m.role = role;
              m.content = text;
              m.created_at = session.created_at;
              KEEL_RETURN_IF_ERROR(tx.messages().InsertMessage(m));
              tx.Carry("messages", store::RowImage(m));
              KEEL_RETURN_IF_ERROR(tx.events().Append({session.tenant_id,
                                                       "message.created@v1",
                                                       agent.id,
                                                       session.id,
                                                       "",
                                                       {{"message_id", m.id}, {"role", m.role}}}));
            }
            return Status::Ok();
          });
          if (!opened.ok()) co_return OpenAiErrorOf(opened.status());
          Json event = {
              {"agent_id", agent.id}, {"session_id", session.id}, {"title", session.title}};
          co_await ctx.runtime.EmitFor(session.tenant_id, agent.id, "session.opened",
                                       std::move(event));
        }

        // Subscribed before the message goes in, so that no token of its answer is missed.
        auto sub = ctx.hub.Subscribe({who.tenant_id, "", session.id, "", /*deltas=*/true});
        runtime::IntakeRequest intake;
        intake.tenant_id = who.tenant_id;
        intake.session_id = session.id;
        intake.content = chat->prompt;
        intake.idempotency_key = req.Header("idempotency-key");
        if (auto st = CheckClientIdempotencyKey(intake.idempotency_key); !st.ok()) {
          ctx.hub.Unsubscribe(sub);
          co_return OpenAiErrorOf(st);
        }
        intake.requested_by = who.token_id;
        intake.caller_role = who.role;
        // A stream shows the answer as it comes: only a whole answer waits for the run's end.
        intake.answered_after_run = !chat->stream;
        auto posted = co_await ctx.runtime.PostMessage(intake);
        if (!posted.ok()) {
          ctx.hub.Unsubscribe(sub);
          Response r = OpenAiErrorOf(posted.status());
          const Code code = posted.status().code();
          if (code == Code::kRateLimited || code == Code::kUnavailable)
            r.headers["Retry-After"] = "1";
          r.headers[kSessionHeader] = session.id;
          co_return r;
        }
        store::Run run = std::move(posted->run);
        const bool just_claimed = !posted->replayed;
        const std::string id = "chatcmpl-" + run.id;
        const int64_t created = Seconds(run.created_at);

        if (!chat->stream) {
          ctx.hub.Unsubscribe(sub);
          auto waited = co_await WaitForRun(ctx, std::move(run), wait, just_claimed,
                                            /*through_approval=*/true);
          if (!waited.ok()) co_return NotRetried(OpenAiErrorOf(waited.status()));
          Response r;
          if (auto failure = RunFailure(*waited, wait)) {
            r = std::move(*failure);
          } else {
            Json message = {
                {"role", "assistant"}, {"content", waited->output}, {"refusal", nullptr}};
            Json choice = {{"index", 0},
                           {"message", std::move(message)},
                           {"logprobs", nullptr},
                           {"finish_reason", "stop"}};
            r = Response::Json(200, {{"id", id},
                                     {"object", "chat.completion"},
                                     {"created", created},
                                     {"model", chat->model},
                                     {"system_fingerprint", nullptr},
                                     {"choices", Json::array({std::move(choice)})},
                                     {"usage", UsageJson(*waited)}});
          }
          r.headers[kSessionHeader] = session.id;
          r.headers["X-Keel-Run"] = waited->id;
          co_return r;
        }

        Response r;
        r.content_type = "text/event-stream";
        r.headers["Cache-Control"] = "no-cache";
        r.headers["X-Accel-Buffering"] = "no";
        r.headers[kSessionHeader] = session.id;
        r.headers["X-Keel-Run"] = run.id;
        r.stream = [&ctx, sub, run = std::move(run), id, created, model = chat->model,
                    include_usage = chat->include_usage,
                    wait](http::StreamWriter& w) mutable -> asio::awaitable<void> {
          struct Leave {
            ApiContext& ctx;
            runtime::EventHub::SubscriptionPtr sub;
            ~Leave() { ctx.hub.Unsubscribe(sub); }
          } leave{ctx, sub};
          const auto deadline = std::chrono::steady_clock::now() +
                                std::chrono::milliseconds(static_cast<int64_t>(wait * 1000));
          // (Built outside the co_await: g++ 12 cannot keep a braced Json of string literals
          // in a coroutine's awaited expression.)
          std::string opening = SseData(ChunkJson(id, created, model, RoleDelta(), nullptr));
          if (!co_await w.Write(std::move(opening))) co_return;
          std::string sent;        // the answer's text streamed so far
          bool announced = false;  // that the run waits for an approval
          bool check = true;       // read the run: at first, then after its session's events
          while (true) {
            std::string out;
            for (auto& d : ctx.hub.TakeDeltas(sub)) {
              if (d.run_id != run.id || d.text.empty()) continue;
              sent += d.text;
              out += SseData(ChunkJson(id, created, model, {{"content", d.text}}, nullptr));
            }
            const bool late = std::chrono::steady_clock::now() >= deadline;
            if (ctx.hub.TakeDirty(sub) || check || late) {
              check = false;
              Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
                KEEL_ASSIGN_OR_RETURN(run, tx.runs().GetRun(run.tenant_id, run.id));
                return Status::Ok();
              });
              if (!st.ok()) {
                out += SseData(ErrorChunk(OpenAiErrorOf(st)));
                (void)co_await w.Write(std::move(out));
                co_return;
              }
            }
            if (run.Terminal() || late) {
              if (auto failure = RunFailure(run, wait)) {
                out += SseData(ErrorChunk(*failure));
                (void)co_await w.Write(std::move(out));
                co_return;
              }
              // The answer's text that no delta carried (it ran on another node, or the
              // provider does not stream).
              if (run.output.size() > sent.size() &&
                  run.output.compare(0, sent.size(), sent) == 0) {
                out += SseData(ChunkJson(id, created, model,
                                         {{"content", run.output.substr(sent.size())}}, nullptr));
              }
              out += SseData(ChunkJson(id, created, model, Json::object(), "stop"));
              if (include_usage) {
                Json usage = {{"id", id},
                              {"object", "chat.completion.chunk"},
                              {"created", created},
                              {"model", model},
                              {"system_fingerprint", nullptr},
                              {"choices", Json::array()},
                              {"usage", UsageJson(run)}};
                out += SseData(usage);
              }
              out += "data: [DONE]\n\n";
              (void)co_await w.Write(std::move(out));
              co_return;
            }
            // Parked for a human: said in an SSE comment, which clients skip, and the stream
            // waits on for the decision.
            if (run.status == "waiting_for_approval" && !announced) {
              announced = true;
              out += ": run " + run.id +
                     " is waiting for an approval (GET /v1/approvals?status=pending); the answer "
                     "follows the decision\n\n";
            } else if (run.status != "waiting_for_approval") {
              announced = false;
            }
            if (!out.empty() && !co_await w.Write(std::move(out))) co_return;
            if (ctx.hub.closing()) {
              std::string bye =
                  ": this node is stopping; the run goes on (GET /v1/runs/" + run.id + ")\n\n";
              (void)co_await w.Write(std::move(bye));
              co_return;
            }
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            auto before = std::chrono::steady_clock::now();
            co_await ctx.hub.Wait(sub, std::clamp(left, std::chrono::milliseconds(1),
                                                  std::chrono::milliseconds(15000)));
            if (std::chrono::steady_clock::now() - before >= std::chrono::seconds(15)) {
              if (!co_await w.Ping()) co_return;
            }
          }
        };
        co_return r;
      },
      /*requires_auth=*/true, &OpenAiErrorOf);

  // The agents a token may talk to, as Chat Completions models (their names).
  router.Add(
      "GET", "/v1/models",
      [&ctx](Request& req) -> asio::awaitable<Response> {
        std::vector<store::Agent> agents;
        Status st = co_await store::AsyncRead(ctx.store, [&](store::Tx& tx) -> Status {
          agents.clear();
          store::Page page;
          page.limit = 500;
          while (true) {
            KEEL_ASSIGN_OR_RETURN(auto got, tx.agents().ListAgents(req.principal.tenant_id, page));
            for (auto& a : got.items) {
              Status reach = access::Reachable(tx, a.tenant_id, req.principal.user_id, a.id);
              if (reach.code() == Code::kNotFound) continue;
              KEEL_RETURN_IF_ERROR(reach);
              agents.push_back(std::move(a));
            }
            if (got.next_cursor.empty()) return Status::Ok();
            page.cursor = got.next_cursor;
          }
        });
        if (!st.ok()) co_return OpenAiErrorOf(st);
        Json data = Json::array();
        for (const auto& a : agents) {
          data.push_back({{"id", a.name},
                          {"object", "model"},
                          {"created", Seconds(a.created_at)},
                          {"owned_by", "keel"}});
        }
        co_return Response::Json(200, {{"object", "list"}, {"data", std::move(data)}});
      },
      /*requires_auth=*/true, &OpenAiErrorOf);
}

}  // namespace keel::api
