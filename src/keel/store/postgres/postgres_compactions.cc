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

Result<std::vector<Message>> PostgresTx::ConversationSince(const std::string& tenant_id,
                                                           const std::string& session_id,
                                                           const std::string& after_id,
                                                           const std::string& before_id,
                                                           int limit) {
  static const std::string kSql = "SELECT " + std::string(kConversationCols) +
                                  " FROM messages WHERE tenant_id=$1 AND session_id=$2 AND "
                                  "id>$3 AND id<$4 AND role IN ('user','assistant') ORDER BY id "
                                  "LIMIT $5";
  KEEL_RETURN_IF_ERROR(BindTenant(tenant_id));
  KEEL_ASSIGN_OR_RETURN(auto rows, conn_.Query(kSql, P(tenant_id, session_id, after_id, before_id,
                                                       static_cast<int64_t>(limit))));
  return Collect<Message>(rows, ReadConversationMessage<Row>);
}

}  // namespace keel::store::postgres
