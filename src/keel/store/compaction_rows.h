#pragma once
// Internal to the store backends: the columns of the compactions table and how a row maps to a
// Compaction (as rows.h does for the kernel's records).

#include "keel/store/compaction_store.h"
#include "keel/store/rows.h"

namespace keel::store::rows {

inline constexpr const char* kCompactionCols =
    "id, tenant_id, session_id, run_id, last_message_id, summary, messages, tokens_before, "
    "tokens_after, created_at";
template <typename Row>
Compaction ReadCompaction(const Row& s) {
  Compaction c;
  c.id = s.Text(0);
  c.tenant_id = s.Text(1);
  c.session_id = s.Text(2);
  c.run_id = s.Text(3);
  c.last_message_id = s.Text(4);
  c.summary = s.Text(5);
  c.messages = s.Int(6);
  c.tokens_before = s.Int(7);
  c.tokens_after = s.Int(8);
  c.created_at = s.Int(9);
  return c;
}

}  // namespace keel::store::rows
