// Context assembly: what a model turn starts from. The system prompt (the agent's instructions,
// the index of its skills and the summary of the session's compacted turns), the session's
// messages since that summary, and the run's prompt. When that would exceed the agent's token
// budget, the oldest turns are first summarized by the model into a compaction record
// (docs/CONTEXT.md). The agent's skills are brought up to date in its workspace on the way
// (docs/SKILLS.md).

#include "keel/runtime/context.h"

#include <algorithm>
#include <filesystem>

#include "keel/common/ids.h"
#include "keel/common/log.h"
#include "keel/metrics.h"
#include "keel/model/context_requests.h"
#include "keel/model/provider.h"
#include "keel/plugins/bus.h"
#include "keel/plugins/host.h"
#include "keel/runs/run_state.h"
#include "keel/runtime/model_calls.h"
#include "keel/runtime/plugin_bridge.h"
#include "keel/runtime/runtime.h"
#include "keel/skills/skills.h"
#include "keel/store/async.h"
#include "keel/store/compaction_store.h"
#include "keel/store/row_images.h"
#include "keel/tools/gateway.h"

namespace keel::runtime {

namespace asio = boost::asio;

namespace {

// At most this many summaries per turn: a session with a long history that was never compacted
// (its agent's budget was raised, then lowered) catches up over several turns.
constexpr int kMaxCompactionsPerTurn = 8;

// A message costs its text and a little for its role.
int64_t MessageTokens(const std::string& content) { return EstimateTokens(content) + 4; }

int64_t ContextTokens(const std::string& system, std::span<const store::Message> messages,
                      size_t from, const std::string& prompt) {
  int64_t n = (system.empty() ? 0 : MessageTokens(system)) + MessageTokens(prompt);
  for (size_t i = from; i < messages.size(); ++i) n += MessageTokens(messages[i].content);
  return n;
}

// The agent's instructions, then each non-empty part, separated by blank lines.
std::string SystemPrompt(const std::string& instructions, const std::vector<std::string>& parts) {
  std::string out = instructions;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    if (!out.empty()) out += "\n\n";
    out += p;
  }
  return out;
}

std::string SummarySection(const std::string& summary) {
  if (summary.empty()) return "";
  return "## Earlier in this session\nThe conversation before the messages below, summarized:\n" +
         summary;
}

// The system prompt of an introspection run: what it is for, and what it tends.
// (The working memory, if any, follows it as every turn's does: run_executor.cc.)
std::string IntrospectionPrompt(const std::string& instructions, const std::string& description) {
  std::string out =
      std::string(model::kIntrospectRequest) +
      "\nYou are looking back over one of your sessions between turns. Nobody reads your "
      "answer: act with your tools.\n"
      "- Call introspection.set_description with one line on what this session is about.\n"
      "- Call introspection.set_working_memory with the notes you want in the prompt of all "
      "your sessions from now on: the current ones, updated with what you learned here. Keep "
      "them short.\n"
      "- Call memory.upsert with a fact worth finding later (memory.search first, to update "
      "rather than repeat one).";
  if (!instructions.empty()) out += "\n\n## Your instructions\n" + instructions;
  out += "\n\n## The session's description now\n" + (description.empty() ? "(none)" : description);
  return out;
}

std::string OneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

// Keel's summarization request (model/context_requests.h).
std::vector<model::ChatMessage> SummaryRequest(const std::string& previous,
                                               const std::vector<store::Message>& fold,
                                               int64_t max_chars) {
  std::string instructions =
      std::string(model::kSummarizeRequest) +
      "\nThe summary replaces the earlier turns in the context of later turns, so keep every "
      "fact, name, number, preference, decision and open task a later turn may need, and drop "
      "pleasantries. Fold the summary so far in. Answer with the summary only, as short plain "
      "sentences or a list. " +
      std::string(model::kSummaryLimit) + " " + std::to_string(max_chars) + " characters.";
  std::string material = std::string(model::kSummarySoFar) + "\n" +
                         (previous.empty() ? "(none)" : previous) + "\n\n" +
                         std::string(model::kConversationToAdd) + "\n";
  for (const auto& m : fold) material += m.role + ": " + OneLine(m.content) + "\n";
  return {{"system", instructions, {}, "", ""}, {"user", material, {}, "", ""}};
}

// The last user message of an introspection run.
std::string IntrospectionAsk(const std::string& content) {
  return "Look back over the conversation above (introspection, trigger: " +
         IntrospectionTrigger(content) +
         ") and update the session's description and your working memory with your tools.";
}

Json MessagesJson(const std::vector<model::ChatMessage>& messages) {
  Json out = Json::array();
  for (const auto& m : messages) out.push_back({{"role", m.role}, {"content", m.content}});
  return out;
}

// Enough of the conversation since the last summary to see whether it outgrew history_limit.
int WindowLimit(int history_limit) { return 4 * std::max(1, history_limit); }


}  // namespace

Result<ContextSettings> ContextSettingsOf(const Json& config) {
  ContextSettings out;
  if (!config.is_object()) return out;
  auto integer = [&](const Json& v, const std::string& field, int64_t lo,
                     int64_t hi) -> Result<int64_t> {
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
      return InvalidArgument("config." + field + " must be an integer from " + std::to_string(lo) +
                             " to " + std::to_string(hi));
    }
    return v.get<int64_t>();
  };
  if (config.contains("context_tokens")) {
    KEEL_ASSIGN_OR_RETURN(out.context_tokens,
                          integer(config["context_tokens"], "context_tokens", 256, 10000000));
  }
  if (config.contains("introspection")) {
    const Json& in = config["introspection"];
    if (!in.is_object()) {
      return InvalidArgument(
          "config.introspection must be an object {\"idle_seconds\", "
          "\"every_turns\"}");
    }
    for (auto it = in.begin(); it != in.end(); ++it) {
      if (it.key() == "idle_seconds") {
        KEEL_ASSIGN_OR_RETURN(out.idle_seconds,
                              integer(*it, "introspection.idle_seconds", 1, 30 * 24 * 3600));
      } else if (it.key() == "every_turns") {
        KEEL_ASSIGN_OR_RETURN(out.every_turns, integer(*it, "introspection.every_turns", 1, 10000));
      } else {
        return InvalidArgument("config.introspection has an unknown field '" + it.key() +
                               "' (it takes idle_seconds and every_turns)");
      }
    }
  }
  return out;
}

asio::awaitable<Status> Runtime::SyncSkills(const store::Run& run,
                                            std::vector<store::Skill> skills) {
  const std::string workspace = gateway_.WorkspaceOf(run.agent_id);
  std::error_code ec;
  if (skills.empty() && !std::filesystem::exists(workspace + "/skills", ec)) co_return Status::Ok();
  // Only the skills whose copy is not current are read with their files and written.
  std::vector<std::string> stale = skills::StaleSkills(workspace, skills);
  if (!stale.empty()) {
    Status read = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      for (auto& s : skills) {
        if (std::find(stale.begin(), stale.end(), s.name) == stale.end()) continue;
        KEEL_ASSIGN_OR_RETURN(s, tx.skills().GetSkill(run.tenant_id, s.name, true));
      }
      return Status::Ok();
    });
    if (!read.ok()) co_return read;
  }
  co_return skills::SyncWorkspace(workspace, skills);
}

Status Runtime::ReadContext(store::Tx& tx, const store::Run& run, const store::Message& prompt,
                            ContextRead& out) {
  KEEL_RETURN_IF_ERROR(ReadWindow(tx, run, WindowLimit(options_.history_limit), out));
  if (out.session_read || prompt.role == "introspection") {
    KEEL_ASSIGN_OR_RETURN(out.session, tx.sessions().GetSession(run.tenant_id, run.session_id));
  }
  return Status::Ok();
}

// The session's newest compaction and what the conversation since it (at most window_limit)
// has that `read.known` lacks; KeepWindow makes the window of it.
Status Runtime::ReadWindow(store::Tx& tx, const store::Run& run, int window_limit,
                           ContextRead& read) {
  // The compaction and the conversation after it go out together (one round trip on
  // PostgreSQL), reading from where the entry ends: FetchFrom's answer unless a compaction the
  // entry cannot take came since, which the check below catches and reads again for.
  const int64_t from = read.known ? read.known->last_seq : 0;
  KEEL_RETURN_IF_ERROR(
      tx.compactions().LatestCompactionLater(run.tenant_id, run.session_id, read.summary));
  KEEL_ASSIGN_OR_RETURN(read.fetched, tx.compactions().ConversationSinceLatest(
                                          run.tenant_id, run.session_id, from, window_limit));
  const std::string after = read.summary ? read.summary->last_message_id : std::string();
  read.fetched_from = FetchFrom(read.known.get(), after);
  if (read.fetched_from != from) {
    KEEL_ASSIGN_OR_RETURN(read.fetched,
                          tx.compactions().ConversationSince(run.tenant_id, run.session_id, after,
                                                             read.fetched_from, window_limit));
  }
  return Status::Ok();
}

void Runtime::KeepWindow(const store::Run& run, ContextRead& read) {
  const std::string after = read.summary ? read.summary->last_message_id : std::string();
  auto entry = Merge(std::move(read.known), read.fetched_from, after, std::move(read.fetched),
                     WindowLimit(options_.history_limit));
  read.fetched = {};
  // Up to the prompt: what was posted after it is not this turn's. (A prompt the conversation
  // does not hold, an introspection's, or one past a cut entry's end: all of it.)
  const auto& m = entry->messages;
  auto prompt = std::find_if(m.rbegin(), m.rend(),
                             [&](const store::Message& x) { return x.id == run.message_id; });
  const size_t end = prompt == m.rend() ? m.size() : m.size() - 1 - (prompt - m.rbegin());
  read.window = std::span<const store::Message>(m.data(), end);
  read.known = std::move(entry);
}

asio::awaitable<Status> Runtime::AssembleContext(
    const store::Run& run, const store::Agent& agent, const store::Message& prompt,
    const std::shared_ptr<plugins::AgentPlugins>& plugins, ContextRead read,
    model::ModelRequest& request, std::vector<store::Step>& steps, std::string& error_code,
    std::optional<FailedSummary>& failed, HistoryMark& history) {
  error_code = "internal";
  auto settings = ContextSettingsOf(agent.config);
  if (!settings.ok()) co_return settings.status();  // written before it was checked
  const int64_t budget = settings->context_tokens;
  const int history_limit = std::max(1, options_.history_limit);
  const int window_limit = WindowLimit(history_limit);

  std::optional<store::Compaction>& summary = read.summary;
  std::span<const store::Message>& window = read.window;
  std::vector<store::Skill>& skills = read.skills;
  const store::Session& session = read.session;
  auto read_window = [&](store::Tx& tx) { return ReadWindow(tx, run, window_limit, read); };
  // Before the turn's tools run. A copy that fails does not stop the turn: skills.read still
  // reads the skills from the store.
  if (Status synced = co_await SyncSkills(run, skills); !synced.ok()) {
    LogError("agent " + run.agent_id +
             ": cannot copy its skills into its workspace: " + synced.message());
  }
  // An introspection run gets its own instructions instead of the agent's turn prompt.
  const bool introspection = prompt.role == "introspection";
  const std::string fixed =
      introspection
          ? IntrospectionPrompt(agent.instructions, session.description)
          : SystemPrompt(agent.instructions, {session.instructions, skills::SkillIndex(skills)});
  auto system_with = [&](const std::string& s) { return SystemPrompt(fixed, {SummarySection(s)}); };

  // Compaction: while the conversation since the last summary is more than history_limit
  // messages or the context more than the budget, fold its oldest messages into a new summary.
  for (int round = 0; round < kMaxCompactionsPerTurn; ++round) {
    const std::string previous = summary ? summary->summary : std::string();
    const bool more = static_cast<int>(window.size()) == window_limit;  // the window is cut
    const int64_t before = ContextTokens(system_with(previous), window, 0, prompt.content);
    if (!more && static_cast<int>(window.size()) <= history_limit && before <= budget) break;
    // Keep the newest messages that fit in half the budget (at most half of history_limit);
    // fold the rest, as much of it as one summarization request can take.
    size_t keep = 0;
    if (!more) {
      int64_t room =
          budget / 2 - MessageTokens(system_with(previous)) - MessageTokens(prompt.content);
      const size_t most = static_cast<size_t>(std::max(1, history_limit / 2));
      while (keep < window.size() && keep < most) {
        int64_t t = MessageTokens(window[window.size() - 1 - keep].content);
        if (t > room) break;
        room -= t;
        ++keep;
      }
    }
    std::vector<store::Message> fold(window.begin(),
                                     window.end() - static_cast<std::ptrdiff_t>(keep));
    int64_t request_tokens = MessageTokens(previous) + 200;
    size_t n = 0;
    while (n < fold.size()) {
      int64_t t = MessageTokens(fold[n].content);
      if (n > 0 && request_tokens + t > budget) break;
      request_tokens += t;
      ++n;
    }
    fold.resize(n);
    if (fold.empty()) break;  // only the system prompt and the prompt: nothing to fold

    model::ModelRequest ask;
    ask.model = request.model;
    ask.agent_config = agent.config;
    // A quarter of the budget for the summary (about four characters a token).
    ask.messages = SummaryRequest(previous, fold, budget);
    if (plugins->Wants("model.before")) {  // e.g. redaction applies to this call as to any
      Json payload = {{"agent_id", run.agent_id},
                      {"session_id", run.session_id},
                      {"run_id", run.id},
                      {"model", agent.model},
                      {"messages", MessagesJson(ask.messages)},
                      {"tools", Json::array()}};
      auto out = co_await plugins_->Emit(plugins, "model.before", std::move(payload));
      if (out.abort) {
        error_code = "plugin_failed";
        co_return InvalidArgument("plugin " + out.abort->plugin_id +
                                  " failed on model.before: " + out.abort->message);
      }
      const Json& rewritten =
          out.changed && out.payload.contains("messages") ? out.payload["messages"] : Json();
      if (rewritten.is_array() && rewritten.size() == ask.messages.size()) {
        for (size_t i = 0; i < rewritten.size(); ++i) {
          if (rewritten[i].is_object() && rewritten[i].contains("content") &&
              rewritten[i]["content"].is_string()) {
            ask.messages[i].content = rewritten[i]["content"].get<std::string>();
          }
        }
      }
    }
    store::Step step;
    step.id = NewId();
    step.tenant_id = run.tenant_id;
    step.run_id = run.id;
    step.seq = steps.empty() ? 1 : steps.back().seq + 1;
    step.kind = "compaction";
    step.started_at = NowMillis();
    ++metrics_.model_calls;
    // Through the router, as any model call: the cache, the budgets, the agent's fallback,
    // metering. A summary is not part of the conversation: not streamed.
    std::function<void(const std::string&)> no_deltas;
    ModelCall call = co_await models_->Call(run, agent, ask, no_deltas);
    if (call.store_failed) {  // the store failed: the run resumes after its lease
      error_code.clear();
      co_return call.response.status();
    }
    step.input = {{"model", agent.model},
                  {"messages", static_cast<int64_t>(fold.size())},
                  {"tokens_before", before},
                  {"budget", budget}};
    const bool answered = call.response.ok() && !call.response->text.empty();
    if (!answered) {
      const bool stopped = !call.budget_exceeded.is_null();  // no call was made
      if (!stopped) ++metrics_.model_errors;
      if (call.response.ok()) {  // the model answered, with nothing: its tokens were spent
        metrics_.input_tokens += call.response->usage.input_tokens;
        metrics_.output_tokens += call.response->usage.output_tokens;
      }
      error_code = stopped ? "budget_exceeded" : "compaction_failed";
      std::string why = stopped ? call.BudgetMessage()
                        : call.response.ok() ? std::string("the model answered nothing")
                                             : call.response.status().message();
      step.status = "failed";
      step.finished_at = NowMillis();
      step.output = {{"error", why}};
      if (call.response.ok()) {
        step.output["usage"] = {{"input_tokens", call.response->usage.input_tokens},
                                {"output_tokens", call.response->usage.output_tokens}};
      }
      call.Describe(step.output);
      failed = FailedSummary{step, std::move(call)};
      co_return stopped ? PermissionDenied(why)
                        : Unavailable("summarizing the session's earlier messages failed: " + why);
    }
    const model::Usage usage = call.response->usage;
    metrics_.input_tokens += usage.input_tokens;
    metrics_.output_tokens += usage.output_tokens;

    store::Compaction c;
    c.id = NewId();
    c.tenant_id = run.tenant_id;
    c.session_id = run.session_id;
    c.run_id = run.id;
    c.last_message_id = fold.back().id;
    c.summary = call.response->text;
    c.messages = static_cast<int64_t>(fold.size());
    c.tokens_before = before;
    c.tokens_after = ContextTokens(system_with(c.summary), window, fold.size(), prompt.content);
    c.created_at = NowMillis();
    step.status = "succeeded";
    step.finished_at = c.created_at;
    step.output = {{"compaction_id", c.id},
                   {"last_message_id", c.last_message_id},
                   {"summary", c.summary},
                   {"tokens_after", c.tokens_after},
                   {"usage",
                    {{"input_tokens", usage.input_tokens},
                     {"output_tokens", usage.output_tokens}}}};
    call.Describe(step.output);
    auto recorded = co_await store::AsyncWrite(store_, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(auto cur, runs::Held(tx, run));
      KEEL_RETURN_IF_ERROR(tx.compactions().InsertCompaction(c));
      tx.Carry("compactions", store::RowImage(c));
      KEEL_RETURN_IF_ERROR(tx.runs().InsertStep(step));
      tx.Carry("run_steps", store::RowImage(step));
      KEEL_RETURN_IF_ERROR(call.Record(tx, cur, step));  // its usage record, model.fallback@v1
      KEEL_RETURN_IF_ERROR(runs::AddTokens(tx, cur, usage.input_tokens, usage.output_tokens));
      return tx.events().Append({run.tenant_id,
                                 "session.compacted@v1",
                                 run.agent_id,
                                 run.session_id,
                                 run.id,
                                 {{"compaction_id", c.id},
                                  {"messages", c.messages},
                                  {"last_message_id", c.last_message_id},
                                  {"tokens_before", c.tokens_before},
                                  {"tokens_after", c.tokens_after},
                                  {"budget", budget}}});
    });
    if (!recorded.ok()) co_return recorded.status();
    steps.push_back(step);  // the replay after this sees it, and numbers the next steps on
    Status again = co_await store::AsyncRead(store_, read_window);
    if (!again.ok()) co_return again;
    KeepWindow(run, read);
  }

  // The context: the system prompt with the summary, the newest history_limit messages since
  // it, the prompt. (Only a history too long to catch up in one turn leaves messages out.)
  const bool cut = static_cast<int>(window.size()) == window_limit;
  std::vector<store::Message> recent;  // when the window is cut: the newest instead
  std::span<const store::Message> tail = window;
  if (cut) {
    Status read_recent = co_await store::AsyncRead(store_, [&](store::Tx& tx) -> Status {
      KEEL_ASSIGN_OR_RETURN(recent,
                            tx.messages().RecentMessages(run.tenant_id, run.session_id,
                                                         summary ? summary->last_message_id : "",
                                                         run.message_id, history_limit));
      return Status::Ok();
    });
    if (!read_recent.ok()) co_return read_recent;
    tail = recent;
  }
  if (tail.size() > static_cast<size_t>(history_limit)) tail = tail.last(history_limit);
  const std::string system = system_with(summary ? summary->summary : std::string());
  request.messages.reserve(request.messages.size() + tail.size() + 3);
  if (!system.empty()) request.messages.push_back({"system", system, {}, "", ""});
  // The history's digest goes on from the last turn's when the tail is the kept conversation's.
  history = HashHistory(tail, request.messages.size(),
                        !cut && read.known ? &read.known->history : nullptr);
  for (const auto& m : tail) {
    if (InConversation(m)) request.messages.push_back({m.role, m.content, {}, {}, {}});
  }
  // Kept for the next turn once nothing here points into it any more.
  if (read.known) conversations_.Put(run.tenant_id, run.session_id, std::move(read.known));
  request.messages.push_back(
      {"user", introspection ? IntrospectionAsk(prompt.content) : prompt.content, {}, "", ""});
  co_return Status::Ok();
}

}  // namespace keel::runtime
