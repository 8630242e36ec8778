#include "keel/memory/memory.h"

#include <algorithm>
#include <cctype>

#include "keel/common/ids.h"
#include "keel/common/time.h"
#include "keel/memory/query.h"
#include "keel/store/row_images.h"

namespace keel::memory {

namespace {

bool AllOf(const std::string& s, bool (*ok)(char)) { return std::all_of(s.begin(), s.end(), ok); }

bool IdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == ':' || c == '-';
}
bool SourceChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}
bool Blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

Json NullIfEmpty(const std::string& s) { return s.empty() ? Json(nullptr) : Json(s); }

}  // namespace

Status CheckTag(const std::string& tag) {
  if (tag.empty() || tag.size() > kMaxTagBytes) {
    return InvalidArgument("a tag is 1 to " + std::to_string(kMaxTagBytes) + " bytes, got " +
                           std::to_string(tag.size()));
  }
  for (unsigned char c : tag) {
    if (c < 0x20 || c == 0x7F) return InvalidArgument("a tag may not hold control characters");
  }
  if (AllOf(tag, Blank)) return InvalidArgument("a tag may not be only white space");
  return Status::Ok();
}

Status CheckSearchLimit(int limit) {
  if (limit < 1 || limit > kMaxSearchLimit) {
    return InvalidArgument("limit must be between 1 and " + std::to_string(kMaxSearchLimit) +
                           " for a search, got " + std::to_string(limit));
  }
  return Status::Ok();
}

Result<store::Memory> MemoryFrom(const Json& fields, const std::string& tenant_id,
                                 const std::string& agent_id, const std::string& default_source) {
  if (!fields.is_object()) return InvalidArgument("a memory is a JSON object");
  for (auto it = fields.begin(); it != fields.end(); ++it) {
    if (it.key() != "text" && it.key() != "tags" && it.key() != "id" && it.key() != "source") {
      return InvalidArgument("unknown field '" + it.key() +
                             "' (a memory has text, tags, id and source)");
    }
  }
  store::Memory m;
  m.tenant_id = tenant_id;
  m.agent_id = agent_id;
  KEEL_ASSIGN_OR_RETURN(m.text, ReqString(fields, "text"));
  if (AllOf(m.text, Blank)) return InvalidArgument("text must not be only white space");
  if (m.text.size() > kMaxTextBytes) {
    return InvalidArgument("text is longer than " + std::to_string(kMaxTextBytes) + " bytes (" +
                           std::to_string(m.text.size()) + ")");
  }
  if (fields.contains("tags")) {
    const Json& tags = fields["tags"];
    if (!tags.is_array()) return InvalidArgument("tags must be an array of strings");
    for (const auto& t : tags) {
      if (!t.is_string()) return InvalidArgument("tags must be an array of strings");
      const std::string& tag = t.get_ref<const std::string&>();
      if (Status st = CheckTag(tag); !st.ok()) return InvalidArgument("tags: " + st.message());
      if (std::find(m.tags.begin(), m.tags.end(), t) == m.tags.end()) m.tags.push_back(tag);
    }
    if (static_cast<int>(m.tags.size()) > kMaxTags) {
      return InvalidArgument("a memory has at most " + std::to_string(kMaxTags) + " tags");
    }
  }
  KEEL_ASSIGN_OR_RETURN(m.id, OptString(fields, "id"));
  if (m.id.empty()) {
    if (fields.contains("id")) return InvalidArgument("id must not be empty");
    m.id = NewId();
  } else if (m.id.size() > 128 || !AllOf(m.id, IdChar) ||
             !std::isalnum(static_cast<unsigned char>(m.id[0]))) {
    return InvalidArgument(
        "id must be 1 to 128 of A-Z, a-z, 0-9, '.', '_', ':' and '-', "
        "starting with a letter or digit");
  }
  KEEL_ASSIGN_OR_RETURN(m.source, OptString(fields, "source", default_source));
  if (m.source.empty() || m.source.size() > 32 || !AllOf(m.source, SourceChar) ||
      !(m.source[0] >= 'a' && m.source[0] <= 'z')) {
    return InvalidArgument(
        "source must be 1 to 32 of a-z, 0-9, '.', '_' and '-', starting with "
        "a letter (api, tool, introspection, ...)");
  }
  m.created_at = m.updated_at = NowMillis();
  return m;
}

Result<Upserted> Upsert(store::Tx& tx, store::Memory m, const std::string& session_id,
                        const std::string& run_id) {
  Upserted out;
  auto before = tx.memory().FindMemory(m.tenant_id, m.id);
  if (!before.ok() && before.status().code() != Code::kNotFound) return before.status();
  out.replaced = before.ok();
  if (out.replaced && before->agent_id != m.agent_id) {
    return Conflict("memory " + m.id + " belongs to another agent");
  }
  if (out.replaced) m.created_at = before->created_at;
  KEEL_RETURN_IF_ERROR(tx.memory().UpsertMemory(m));
  tx.Carry("memories", store::RowImage(m));
  KEEL_RETURN_IF_ERROR(tx.events().Append(
      {m.tenant_id,
       "memory.upserted@v1",
       m.agent_id,
       session_id,
       run_id,
       {{"memory_id", m.id}, {"source", m.source}, {"tags", m.tags}, {"replaced", out.replaced}}}));
  out.memory = std::move(m);
  return out;
}

Status Delete(store::Tx& tx, const std::string& tenant_id, const std::string& agent_id,
              const std::string& id, const std::string& session_id, const std::string& run_id) {
  KEEL_RETURN_IF_ERROR(tx.memory().DeleteMemory(tenant_id, agent_id, id));
  tx.Carry("memories", store::DeletedImage({{"tenant_id", tenant_id}, {"id", id}}));
  return tx.events().Append(
      {tenant_id, "memory.deleted@v1", agent_id, session_id, run_id, {{"memory_id", id}}});
}

Result<std::vector<store::MemoryHit>> Search(store::Tx& tx, const std::string& tenant_id,
                                             const std::string& agent_id, const std::string& query,
                                             const std::string& tag, int limit) {
  KEEL_RETURN_IF_ERROR(CheckSearchLimit(limit));
  if (!tag.empty()) KEEL_RETURN_IF_ERROR(CheckTag(tag));
  KEEL_ASSIGN_OR_RETURN(store::MemoryQuery parsed, ParseQuery(query));
  return tx.memory().SearchMemories(tenant_id, agent_id, {parsed, tag, limit});
}

Result<store::WorkingMemory> PutWorkingMemory(store::Tx& tx, const std::string& tenant_id,
                                              const std::string& agent_id, std::string text,
                                              const std::string& session_id,
                                              const std::string& run_id) {
  if (text.size() > kMaxWorkingMemoryBytes) {
    return InvalidArgument("the working memory is longer than " +
                           std::to_string(kMaxWorkingMemoryBytes) + " bytes (" +
                           std::to_string(text.size()) + ")");
  }
  store::WorkingMemory w{tenant_id, agent_id, std::move(text), NowMillis()};
  KEEL_RETURN_IF_ERROR(tx.memory().PutWorkingMemory(w));
  tx.Carry("working_memories", store::RowImage(w));
  KEEL_RETURN_IF_ERROR(tx.events().Append(
      {tenant_id, "working_memory.updated@v1", agent_id, session_id, run_id,
       {{"bytes", w.text.size()}}}));
  return w;
}

Json MemoryJson(const store::Memory& m) {
  return {{"id", m.id},
          {"agent_id", m.agent_id},
          {"text", m.text},
          {"tags", m.tags},
          {"source", m.source},
          {"created_at", FormatRfc3339(m.created_at)},
          {"updated_at", FormatRfc3339(m.updated_at)}};
}

Json HitJson(const store::MemoryHit& hit) {
  Json out = MemoryJson(hit.memory);
  out["score"] = hit.score;
  return out;
}

Json UpsertPayload(const store::Memory& m, bool replaced, const std::string& session_id,
                   const std::string& run_id) {
  return {{"agent_id", m.agent_id},
          {"session_id", NullIfEmpty(session_id)},
          {"run_id", NullIfEmpty(run_id)},
          {"memory_id", m.id},
          {"text", m.text},
          {"tags", m.tags},
          {"source", m.source},
          {"replaced", replaced}};
}

std::string WorkingMemoryPrompt(const store::WorkingMemory& w) {
  if (w.text.empty()) return std::string();
  return "Working memory (your notes, kept between conversations):\n" + w.text;
}

Result<Json> SearchJson(store::Tx& tx, const std::string& tenant_id, const std::string& agent_id,
                        const std::string& query, const std::string& tag, int limit) {
  KEEL_ASSIGN_OR_RETURN(auto hits, Search(tx, tenant_id, agent_id, query, tag, limit));
  Json out = Json::array();
  for (const auto& h : hits) out.push_back(HitJson(h));
  return out;
}

Result<Json> GetJson(store::Tx& tx, const std::string& tenant_id, const std::string& agent_id,
                     const std::string& id) {
  auto m = tx.memory().GetMemory(tenant_id, agent_id, id);
  if (m.ok()) return MemoryJson(*m);
  if (m.status().code() == Code::kNotFound) return Json();
  return m.status();
}

}  // namespace keel::memory
