// SqliteTx's CompactionStore: compaction records and the conversation since one
// (compaction_store.h).

#include <algorithm>

#include "keel/store/compaction_rows.h"
#include "keel/store/sqlite/sqlite_tx.h"

namespace keel::store::sqlite {
namespace {

using namespace rows;  // NOLINT: the shared record readers

}  // namespace

Status SqliteTx::InsertCompaction(const Compaction& c) {
  static const std::string kSql =
      "INSERT INTO compactions(" + std::string(kCompactionCols) + ") VALUES(?,?,?,?,?,?,?,?,?,?)";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  return s
      .BindAll(c.id, c.tenant_id, c.session_id, c.run_id, c.last_message_id, c.summary, c.messages,
               c.tokens_before, c.tokens_after, c.created_at)
      .Run();
}

Result<std::optional<Compaction>> SqliteTx::LatestCompaction(const std::string& tenant_id,
                                                             const std::string& session_id) {
  static const std::string kSql = "SELECT " + std::string(kCompactionCols) +
                                  " FROM compactions WHERE tenant_id=? AND session_id=? "
                                  "ORDER BY id DESC LIMIT 1";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, session_id);
  KEEL_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<Compaction>();
  return std::optional<Compaction>(ReadCompaction(s));
}

Result<Paged<Compaction>> SqliteTx::ListCompactions(const std::string& tenant_id,
                                                    const std::string& session_id,
                                                    const Page& page) {
  const int limit = std::clamp(page.limit, 1, 500);
  static const std::string kSql = "SELECT " + std::string(kCompactionCols) +
                                  " FROM compactions WHERE tenant_id=? AND session_id=? AND id>? "
                                  "ORDER BY id LIMIT ?";
  KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kSql));
  s.BindAll(tenant_id, session_id, DecodeCursor(page.cursor), limit + 1);
  KEEL_ASSIGN_OR_RETURN(auto items, Collect<Compaction>(s, ReadCompaction<Stmt>));
  Paged<Compaction> out;
  if (static_cast<int>(items.size()) > limit) {
    items.resize(limit);
    out.next_cursor = EncodeCursor(items.back().id);
  }
  out.items = std::move(items);
  return out;
}

Result<Conversation> SqliteTx::ConversationSince(const std::string& tenant_id,
                                                 const std::string& session_id,
                                                 const std::string& after_id, int64_t after_seq,
                                                 int limit) {
  Conversation out;
  static const std::string kLast =
      "SELECT coalesce(max(seq), 0) FROM messages WHERE session_id=? AND tenant_id=?";
  KEEL_ASSIGN_OR_RETURN(auto last, db_.Prepare(kLast));
  last.BindAll(session_id, tenant_id);
  KEEL_ASSIGN_OR_RETURN(bool row, last.Step());
  out.last_seq = row ? last.Int(0) : 0;
  if (out.last_seq <= after_seq) return out;
  // The whole conversation (after_seq 0) by id; what came after a seq by seq, through the seq
  // index (its few new rows), then sorted by id.
  static const std::string kAll = "SELECT " + std::string(kConversationCols) +
                                  " FROM messages WHERE tenant_id=? AND session_id=? AND id>? "
                                  "AND role IN ('user','assistant') ORDER BY id LIMIT ?";
  static const std::string kNew = "SELECT " + std::string(kConversationCols) +
                                  " FROM messages WHERE session_id=? AND seq>? AND tenant_id=? "
                                  "AND id>? AND role IN ('user','assistant') ORDER BY seq LIMIT ?";
  if (after_seq <= 0) {
    KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kAll));
    s.BindAll(tenant_id, session_id, after_id, limit);
    KEEL_ASSIGN_OR_RETURN(out.messages, Collect<Message>(s, ReadConversationMessage<Stmt>));
  } else {
    KEEL_ASSIGN_OR_RETURN(auto s, db_.Prepare(kNew));
    s.BindAll(session_id, after_seq, tenant_id, after_id, limit);
    KEEL_ASSIGN_OR_RETURN(out.messages, Collect<Message>(s, ReadConversationMessage<Stmt>));
    std::sort(out.messages.begin(), out.messages.end(),
              [](const Message& a, const Message& b) { return a.id < b.id; });
  }
  return out;
}

}  // namespace keel::store::sqlite
