#include "keel/runs/open_session.h"

#include "keel/store/row_images.h"
#include "keel/store/store.h"

namespace keel::runs {

Status OpenSession(store::Tx& tx, const store::Session& session, std::string_view via) {
  KEEL_RETURN_IF_ERROR(tx.sessions().InsertSession(session));
  tx.Carry("sessions", store::RowImage(session));
  Json payload = {{"title", session.title}};
  if (!via.empty()) payload["via"] = std::string(via);
  return tx.events().Append({session.tenant_id, "session.created@v1", session.agent_id, session.id,
                             "", std::move(payload)});
}

}  // namespace keel::runs
