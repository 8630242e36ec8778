// PostgresTx's CompactionStore: compaction records and the conversation since one
// (compaction_store.h), with the same answers as SqliteTx's.

#include <algorithm>

#include "keel/store/compaction_rows.h"
#include "keel/store/postgres/postgres_tx.h"

namespace keel::store::postgres {
namespace {

using namespace rows;  // NOLINT: the shared record readers

}  // namespace

Status PostgresTx::InsertCompaction(const Compaction& c) {
  static const std::string kSql = "INSERT INTO compactions(" + std::string(kCompactionCols) +
                                  ") VALUES($1,$2,$3,$4,$5,$6,$7,$8,$9,$10) ON CONFLICT DO "
                                  "NOTHING RETURNING id";
  KEEL_RETURN_IF_ERROR(BindTenant(c.tenant_id));
  KEEL_ASSIGN_OR_RETURN(
      auto rows,
      conn_.Query(kSql, P(c.id, c.tenant_id, c.session_id, c.run_id, c.last_message_id, c.summary,
                          c.messages, c.tokens_before, c.tokens_after, c.created_at)));
  if (rows.empty()) return Conflict("compaction already exists: " + c.id);
  return Status::Ok();
}

Result<std::optional<Compaction>> PostgresTx::LatestCompaction(const std::string& tenant_id,
                                                               const std::string& session_id) {
  static const std::string kSql = "SELECT " + std::string(kCompactionCols) +
                                  " FROM compactions WHERE tenant_id=$1 AND session_id=$2 "
                                  "ORDER BY id DESC LIMIT 1";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, session_id)));
  if (rows.empty()) return std::optional<Compaction>();
  return std::optional<Compaction>(ReadCompaction(Row(rows, 0)));
}

Result<Paged<Compaction>> PostgresTx::ListCompactions(const std::string& tenant_id,
                                                      const std::string& session_id,
                                                      const Page& page) {
  const int limit = std::clamp(page.limit, 1, 500);
  static const std::string kSql = "SELECT " + std::string(kCompactionCols) +
                                  " FROM compactions WHERE tenant_id=$1 AND session_id=$2 AND "
                                  "id>$3 ORDER BY id LIMIT $4";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(
      auto rows, conn_.Query(kSql, P(tenant_id, session_id, DecodeCursor(page.cursor), limit + 1)));
  auto items = Collect<Compaction>(rows, ReadCompaction<Row>);
  Paged<Compaction> out;
  if (static_cast<int>(items.size()) > limit) {
    items.resize(limit);
    out.next_cursor = EncodeCursor(items.back().id);
  }
  out.items = std::move(items);
  return out;
}

Result<Conversation> PostgresTx::ConversationSince(const std::string& tenant_id,
                                                   const std::string& session_id,
                                                   const std::string& after_id, int64_t after_seq,
                                                   int limit) {
  // One statement: the newest seq in every row, and a row of NULLs when there is nothing new,
  // so that the newest seq still comes back. The whole conversation (after_seq 0) by id; what
  // came after a seq by seq, through the seq index (its few new rows).
  auto sql = [](const char* order) {
    return "WITH last AS (SELECT coalesce(max(seq), 0) AS seq FROM messages "
           "WHERE session_id=$2 AND tenant_id=$1), "
           "conv AS (SELECT " + std::string(kConversationCols) + " FROM messages "
           "WHERE tenant_id=$1 AND session_id=$2 AND seq>$4 AND id>$3 AND "
           "role IN ('user','assistant') ORDER BY " + order + " LIMIT $5) "
           "SELECT conv.id, conv.role, conv.content, conv.seq, last.seq FROM last "
           "LEFT JOIN conv ON true ORDER BY conv.id";
  };
  static const std::string kAll = sql("id");
  static const std::string kNew = sql("seq");
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(after_seq > 0 ? kNew : kAll,
                                               P(tenant_id, session_id, after_id, after_seq,
                                                 static_cast<int64_t>(limit))));
  Conversation out;
  for (int i = 0; i < rows.size(); ++i) {
    out.last_seq = rows.Int(i, 4);
    if (rows.IsNull(i, 0)) continue;
    out.messages.push_back(ReadConversationMessage<Row>(Row(rows, i)));
  }
  return out;
}

}  // namespace keel::store::postgres
