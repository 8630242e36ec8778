#pragma once
// `keel store rebuild --from-events`: a store's tables rebuilt from its event log alone.
//
// Every event is read in position order (one snapshot of the source) and the row images its
// payload carries (store/row_images.h) are merged, image by image, into the row of their key.
// The rows of RebuiltTables(), the events themselves and the audit chains' heads are then
// written into a new, empty store in one unit of work, as `keel import` writes an archive's.
// A run's lease (lease_owner and lease_expires_at of a run still running) is as its last event
// left it: renewals are not events. The log's own tables (events, audit_heads) are copied.
//
// Events written before they carried row images rebuild nothing: a row whose image is not
// whole after the last event (a session created before then, whose status a later event
// changed) fails the rebuild with the row named, and nothing is written.
//
// Runs on the calling thread and holds the rebuilt rows in memory.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "keel/common/status.h"
#include "keel/store/store.h"

namespace keel::store {

struct RebuildReport {
  int64_t events = 0;                    // events copied
  int64_t events_with_rows = 0;          // of them, those that carried row images
  std::map<std::string, int64_t> rows;   // rows rebuilt, per table of RebuiltTables()
  std::vector<std::string> not_rebuilt;  // exported tables left empty (none today)
};

// The source's audit chains are verified first (with `audit_key`, store/audit.h, their heads'
// signatures too, and a head left unsigned is refused under a key: anyone with the file can
// hash a changed log again), as `keel import` verifies an archive's; an event's images must be
// of its own tenant, as must the rows they change. kConflict when `into` holds data;
// kInvalidArgument when a chain is broken, the log does not hold a whole row, or an image is
// malformed (nothing is written then).
Result<RebuildReport> RebuildFromEvents(Store& from, Store& into, const std::string& audit_key);

}  // namespace keel::store
