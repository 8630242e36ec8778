#pragma once
// The audit chain over the event log. Every event carries a hash: SHA-256 over its immutable
// fields and the hash of the event before it in its chain, one chain per (tenant, origin). Each
// chain has a head row (its last event's id, origin_seq and hash) signed with HMAC-SHA256 under
// a key derived from the KEK, so whoever can write the database but lacks the key cannot
// rewrite a chain, remove its tail or move its head without verification noticing.
//
// Writing (ChainSealer): a store's writer asks for each appended event's hash as it inserts it,
// and writes the heads its transaction moved once, before COMMIT. Verifying (ChainVerifier):
// a tenant's events in position order and its heads, from the store (VerifyTenantChains) or an
// archive, are walked chain by chain; the first event that was changed, removed or moved is
// named.
//
// The hash leaves out origin_seq and position: both are assigned inside the insert, after the
// hash is computed. Order is still covered, since each hash covers its predecessor's;
// verification also checks that origin_seq rises along each chain, and the signed head covers
// the chain's last origin_seq.
//
// A head carries `anchor`: "" when every head of the chain was signed by a key holder that
// could check the head before it, else the last event of the chain at the moment a key holder
// found the head unsigned, missing or not matching its signature (a store that ran without the
// KEK, or a head someone rewrote). The events up to the anchor are covered by their hashes
// only. Without a key, heads are written unsigned and verification reports them as such.

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/store/store.h"
#include "keel/store/types.h"

namespace keel::store {

// OpenStore (store.h) whose writer signs the chain heads with `audit_key` (AuditKeyFromKek).
// OpenStore without it writes them unsigned: for tools and tests that need no signatures.
Result<std::unique_ptr<Store>> OpenStore(const std::string& url, const StoreOptions& options,
                                         const std::string& audit_key);

// The audit key for KEEL_SECRET_KEK's text (base64 of 32 bytes): HMAC-SHA256(KEK, "keel audit
// v1"). Empty text: an empty key (heads unsigned). kInvalidArgument for a malformed KEK.
Result<std::string> AuditKeyFromKek(std::string_view kek_base64);

// What an event's hash covers (the payload as its stored JSON text).
struct ChainedFields {
  std::string_view id;
  std::string_view tenant_id;
  std::string_view type;
  std::string_view origin;
  std::string_view agent_id;
  std::string_view session_id;
  std::string_view run_id;
  std::string_view payload;
  Millis occurred_at = 0;
};

// An event's fields, with `payload` its stored JSON text (which must outlive the result).
inline ChainedFields ChainedOf(const Event& e, std::string_view payload) {
  return {e.id, e.tenant_id, e.type, e.origin, e.agent_id, e.session_id, e.run_id, payload,
          e.occurred_at};
}

// Lowercase hex SHA-256 of the fields' canonical encoding and `prev_hash` ("" for the first
// event of a chain).
std::string EventHash(const ChainedFields& f, std::string_view prev_hash);

struct ChainHead {
  std::string tenant_id;
  std::string origin;
  std::string last_id;
  int64_t last_seq = 0;
  std::string hash;
  std::string anchor;  // see the file comment
  std::string mac;     // hex HMAC-SHA256 of the above; "" unsigned
};

// The head's signature under `key`; "" for an empty key.
std::string HeadMac(std::string_view key, const ChainHead& h);

// The chain bookkeeping of one store writer. Owned by the writer's Tx and used on the writer
// thread only. Heads the writer committed are kept (bounded), so a chain's stored head is read
// once, when the writer first extends it.
//
// Per transaction: Next and Appended for each appended event, then UnitDone or UnitFailed for
// each unit, then Heads (write them) and TransactionDone.
class ChainSealer {
 public:
  // Reads a chain's stored head, or, when there is none but the chain has events, a head of its
  // last event with no signature; nullopt for a chain without events.
  using HeadLoader = std::function<Result<std::optional<ChainHead>>(const std::string& tenant_id,
                                                                    const std::string& origin)>;

  explicit ChainSealer(std::string key) : key_(std::move(key)) {}

  // The hash for the event about to be appended (its chain's head loaded when needed).
  Result<std::string> Next(const ChainedFields& f, const HeadLoader& load);
  // The event was inserted with `hash` (from Next): it is its chain's head in this unit.
  // `origin_seq` 0: not known yet (UnitDone takes it from the unit's events).
  void Appended(const ChainedFields& f, const std::string& hash, int64_t origin_seq = 0);
  // The unit that appended `events` (with the origin_seqs known yet) is part of the
  // transaction.
  void UnitDone(const std::vector<Event>& events);
  // The event `id`, appended by this transaction, was given `origin_seq` (a store that learns
  // it only when its insert is answered, perhaps after its unit's end).
  void SeqArrived(const std::string& tenant_id, const std::string& origin, const std::string& id,
                  int64_t origin_seq);
  void UnitFailed() { unit_.clear(); }
  // The heads the transaction's units moved, signed: to be written before COMMIT.
  std::vector<ChainHead> Heads() const;
  void TransactionDone(bool committed);
  // Forgets every kept head (after rows were written behind the sealer: an import).
  void Forget() { kept_.clear(); }

 private:
  using Key = std::pair<std::string, std::string>;  // tenant_id, origin
  Result<ChainHead*> HeadOf(const Key& k, const HeadLoader& load);

  const std::string key_;
  std::map<Key, ChainHead> kept_;  // committed
  std::map<Key, ChainHead> txn_;   // moved by the transaction's finished units
  std::map<Key, ChainHead> unit_;  // moved by the current unit
};

// One chain as verification found it.
struct ChainReport {
  std::string tenant_id;
  std::string origin;
  int64_t events = 0;
  // "verified": the hashes match and the head's signature checks under the key;
  // "unsigned": the hashes match, the head has no signature (written without a KEK);
  // "unchecked": the hashes match, but there is no key to check the signature with;
  // "tampered": see problem.
  std::string status;
  std::string anchor;  // the head's anchor (signed only after it), or ""
  // For "tampered": the first event found wrong (may be empty when the head itself is what
  // fails, e.g. a chain whose events were all removed) and what is wrong.
  std::string event_id;
  int64_t position = 0;
  int64_t origin_seq = 0;
  std::string problem;
};

// Walks chains from rows shaped like the archive's (ExportTables: "events" with their hash,
// "audit_heads"). Events must come in position order; heads in any order, each after or
// before the events.
class ChainVerifier {
 public:
  // `key` empty: signatures are not checked ("unchecked").
  explicit ChainVerifier(std::string key) : key_(std::move(key)) {}
  // REQUIRES: CheckExportRow ok for the table.
  void AddEvent(const Json& row);
  void AddHead(const Json& row);
  // Every chain, by tenant then origin.
  std::vector<ChainReport> Finish() const;
  // Whether a log may be taken in as it is (`keel import`, `keel store rebuild`): kInvalidArgument
  // naming the first chain that is tampered, or, under a key, whose head is unsigned (anyone
  // with the rows can hash a changed chain again and leave its head unsigned; without a key
  // the hashes are all there is to check).
  Status Trusted() const;

 private:
  struct Walk {
    int64_t events = 0;
    std::string hash;  // the last event's stored hash
    std::string last_id;
    int64_t last_seq = 0;
    std::optional<ChainReport> broken;  // the first problem
  };
  using Key = std::pair<std::string, std::string>;
  const std::string key_;
  std::map<Key, Walk> walks_;
  std::map<Key, ChainHead> heads_;
};

// The tenant's chains in one snapshot of `tx`, with `key` (empty: "unchecked").
Result<std::vector<ChainReport>> VerifyTenantChains(Tx& tx, const std::string& key,
                                                     const std::string& tenant_id);

// The report as the API and `keel audit verify --json` show it:
// {"tenant_id", "status", "events", "problem": {...} | null, "chains": [...]}; status is the
// worst of the chains' ("tampered" > "unchecked" > "unsigned" > "verified"; "verified" for a
// tenant without events).
Json AuditReportJson(const std::string& tenant_id, const std::vector<ChainReport>& chains);

}  // namespace keel::store
