#include "keel/store/audit.h"

#include "keel/common/crypto.h"
#include "keel/secrets/secret_box.h"
#include "keel/store/store.h"

namespace keel::store {
namespace {

// Each field as its length, ':' and its bytes, so no two field lists encode alike.
void Field(std::string& out, std::string_view v) {
  out += std::to_string(v.size());
  out += ':';
  out += v;
}

// Heads the sealer keeps between transactions: one per chain this writer extends (a tenant and
// this node's origin), so the bound only matters for a node serving very many tenants.
constexpr size_t kMaxKeptHeads = 10000;

const std::string& Text(const Json& row, const char* name) {
  return row.at(name).get_ref<const std::string&>();
}
int64_t Int(const Json& row, const char* name) { return row.at(name).get<int64_t>(); }

std::string EventLabel(const std::string& id, int64_t position, int64_t origin_seq) {
  return "event " + id + " (position " + std::to_string(position) + ", origin_seq " +
         std::to_string(origin_seq) + ")";
}

int Rank(const std::string& status) {
  if (status == "tampered") return 3;
  if (status == "unchecked") return 2;
  if (status == "unsigned") return 1;
  return 0;
}

}  // namespace

Result<std::string> AuditKeyFromKek(std::string_view kek_base64) {
  if (kek_base64.empty()) return std::string();
  KEEL_ASSIGN_OR_RETURN(secrets::Key kek, secrets::Key::FromBase64(kek_base64, "KEEL_SECRET_KEK"));
  // A key of its own, so that an audit signature reveals nothing about the KEK's other uses.
  std::string hex = HmacSha256Hex(kek.bytes(), "keel audit v1");
  return hex;
}

std::string EventHash(const ChainedFields& f, std::string_view prev_hash) {
  // Each field as in Field(): its length, ':' and its bytes.
  FieldDigest d;
  d.Raw("keel-event-v1\n");
  d.Add(f.id);
  d.Add(f.tenant_id);
  d.Add(f.type);
  d.Add(f.origin);
  d.Add(f.agent_id);
  d.Add(f.session_id);
  d.Add(f.run_id);
  d.Add(f.payload);
  d.Add(std::to_string(f.occurred_at));
  d.Add(prev_hash);
  return d.HexDigest();
}

std::string HeadMac(std::string_view key, const ChainHead& h) {
  if (key.empty()) return "";
  std::string data = "keel-audit-head-v1\n";
  Field(data, h.tenant_id);
  Field(data, h.origin);
  Field(data, h.last_id);
  Field(data, std::to_string(h.last_seq));
  Field(data, h.hash);
  Field(data, h.anchor);
  return HmacSha256Hex(key, data);
}

// ---- ChainSealer

Result<ChainHead*> ChainSealer::HeadOf(const Key& k, const HeadLoader& load) {
  if (auto it = unit_.find(k); it != unit_.end()) return &it->second;
  ChainHead head;
  if (auto it = txn_.find(k); it != txn_.end()) {
    head = it->second;
  } else if (auto kept = kept_.find(k); kept != kept_.end()) {
    head = kept->second;
  } else {
    KEEL_ASSIGN_OR_RETURN(std::optional<ChainHead> stored, load(k.first, k.second));
    if (stored) {
      head = std::move(*stored);
      // A head this key did not sign (a store that ran without the KEK, a head someone
      // rewrote or removed) is extended, not trusted: the anchor says from where on the
      // signatures vouch for the chain.
      if (!key_.empty() && !ConstantTimeEquals(head.mac, HeadMac(key_, head))) {
        head.anchor = head.last_id;
      }
    }
    head.tenant_id = k.first;
    head.origin = k.second;
  }
  return &unit_.emplace(k, std::move(head)).first->second;
}

Result<std::string> ChainSealer::Next(const ChainedFields& f, const HeadLoader& load) {
  KEEL_ASSIGN_OR_RETURN(ChainHead * head,
                        HeadOf({std::string(f.tenant_id), std::string(f.origin)}, load));
  return EventHash(f, head->hash);
}

void ChainSealer::Appended(const ChainedFields& f, const std::string& hash, int64_t origin_seq) {
  auto it = unit_.find({std::string(f.tenant_id), std::string(f.origin)});
  if (it == unit_.end()) return;  // Next was not asked: nothing to move
  it->second.last_id = std::string(f.id);
  it->second.last_seq = origin_seq;
  it->second.hash = hash;
}

void ChainSealer::UnitDone(const std::vector<Event>& events) {
  for (const Event& e : events) {
    auto it = unit_.find({e.tenant_id, e.origin});
    if (it != unit_.end() && it->second.last_id == e.id && e.origin_seq != 0) {
      it->second.last_seq = e.origin_seq;
    }
  }
  for (auto& [k, head] : unit_) txn_[k] = std::move(head);
  unit_.clear();
}

void ChainSealer::SeqArrived(const std::string& tenant_id, const std::string& origin,
                             const std::string& id, int64_t origin_seq) {
  for (auto* heads : {&unit_, &txn_}) {
    auto it = heads->find({tenant_id, origin});
    if (it != heads->end() && it->second.last_id == id) it->second.last_seq = origin_seq;
  }
}

std::vector<ChainHead> ChainSealer::Heads() const {
  std::vector<ChainHead> heads;
  heads.reserve(txn_.size());
  for (const auto& [k, head] : txn_) {
    if (head.last_id.empty()) continue;  // loaded, never extended
    ChainHead& h = heads.emplace_back(head);
    h.mac = HeadMac(key_, h);
  }
  return heads;
}

void ChainSealer::TransactionDone(bool committed) {
  if (committed) {
    if (kept_.size() + txn_.size() > kMaxKeptHeads) kept_.clear();
    for (auto& [k, head] : txn_) kept_[k] = std::move(head);
  }
  txn_.clear();
  unit_.clear();
}

// ---- ChainVerifier

void ChainVerifier::AddEvent(const Json& row) {
  Key k{Text(row, "tenant_id"), Text(row, "origin")};
  Walk& w = walks_[k];
  const std::string& id = Text(row, "id");
  const int64_t position = Int(row, "position");
  const int64_t seq = Int(row, "origin_seq");
  const std::string& hash = Text(row, "hash");
  ++w.events;
  if (w.broken) return;
  auto broken = [&](std::string problem) {
    ChainReport r;
    r.event_id = id;
    r.position = position;
    r.origin_seq = seq;
    r.problem = EventLabel(id, position, seq) + " " + std::move(problem);
    w.broken = std::move(r);
  };
  if (w.events > 1 && seq <= w.last_seq) {
    broken("comes after origin_seq " + std::to_string(w.last_seq) +
           " in its chain: events were reordered");
    return;
  }
  ChainedFields f{id,
                  k.first,
                  Text(row, "type"),
                  k.second,
                  Text(row, "agent_id"),
                  Text(row, "session_id"),
                  Text(row, "run_id"),
                  Text(row, "payload"),
                  Int(row, "occurred_at")};
  if (hash.empty()) {
    broken("has no hash: it was written outside Keel (or by a node of a Keel from before the "
           "audit chain, whose events the next start of this Keel hashes)");
    return;
  }
  if (hash != EventHash(f, w.hash)) {
    broken("does not match its chain: it was changed, or the event before it in the chain was "
           "removed or moved");
    return;
  }
  w.hash = hash;
  w.last_id = id;
  w.last_seq = seq;
}

void ChainVerifier::AddHead(const Json& row) {
  ChainHead h{Text(row, "tenant_id"), Text(row, "origin"), Text(row, "last_id"),
              Int(row, "last_seq"),   Text(row, "hash"),   Text(row, "anchor"),
              Text(row, "mac")};
  Key k{h.tenant_id, h.origin};
  heads_[k] = std::move(h);
}

Status ChainVerifier::Trusted() const {
  for (const auto& chain : Finish()) {
    const std::string which =
        "the audit chain of tenant " + chain.tenant_id + ", origin " + chain.origin;
    if (chain.status == "tampered") return InvalidArgument(which + " is broken: " + chain.problem);
    if (chain.status == "unsigned" && !key_.empty()) {
      return InvalidArgument(which +
                             " has an unsigned head: its events are covered by their "
                             "hashes only, which anyone can recompute (with KEEL_SECRET_KEK "
                             "unset, the hashes alone are trusted)");
    }
  }
  return Status::Ok();
}

std::vector<ChainReport> ChainVerifier::Finish() const {
  std::map<Key, ChainReport> out;
  for (const auto& [k, w] : walks_) {
    ChainReport r = w.broken ? *w.broken : ChainReport();
    r.tenant_id = k.first;
    r.origin = k.second;
    r.events = w.events;
    if (w.broken) r.status = "tampered";
    out[k] = std::move(r);
  }
  for (const auto& [k, h] : heads_) {
    if (!out.count(k)) out[k] = ChainReport{k.first, k.second};
  }
  for (auto& entry : out) {  // not a structured binding: clang before 16 cannot capture one
    const auto& k = entry.first;
    ChainReport& r = entry.second;
    auto head = heads_.find(k);
    if (head != heads_.end()) r.anchor = head->second.anchor;
    if (r.status == "tampered") continue;
    auto tampered = [&r](std::string event_id, std::string problem) {
      r.status = "tampered";
      r.event_id = std::move(event_id);
      r.problem = std::move(problem);
    };
    auto walk = walks_.find(k);
    if (head == heads_.end()) {
      tampered(walk->second.last_id,
               "the chain has no head: its head row was removed (its last event is " +
                   walk->second.last_id + ")");
      continue;
    }
    const ChainHead& h = head->second;
    if (walk == walks_.end()) {
      tampered(h.last_id, "event " + h.last_id + " (origin_seq " + std::to_string(h.last_seq) +
                              "), the last of the chain by its head, and every event before it "
                              "were removed");
      continue;
    }
    const Walk& w = walk->second;
    if (h.last_id != w.last_id || h.last_seq != w.last_seq || h.hash != w.hash) {
      if (h.last_seq > w.last_seq) {
        tampered(h.last_id, "event " + h.last_id + " (origin_seq " + std::to_string(h.last_seq) +
                                "), the last of the chain by its head, was removed, with any "
                                "event after event " + w.last_id + " (origin_seq " +
                                std::to_string(w.last_seq) + ")");
      } else {
        tampered(w.last_id, "event " + w.last_id + " (origin_seq " + std::to_string(w.last_seq) +
                                ") is not covered by the chain's head, which ends at event " +
                                h.last_id + ": it was added behind Keel's back");
      }
      continue;
    }
    if (h.mac.empty()) {
      r.status = "unsigned";
    } else if (key_.empty()) {
      r.status = "unchecked";
    } else if (!ConstantTimeEquals(h.mac, HeadMac(key_, h))) {
      tampered("", "the signature of the chain's head (event " + h.last_id +
                       ") does not match: the chain was rewritten without the key, or it was "
                       "signed under another KEEL_SECRET_KEK");
    } else {
      r.status = "verified";
    }
  }
  std::vector<ChainReport> reports;
  reports.reserve(out.size());
  for (auto& [k, r] : out) reports.push_back(std::move(r));
  return reports;
}

Result<std::vector<ChainReport>> VerifyTenantChains(Tx& tx, const std::string& key,
                                                     const std::string& tenant_id) {
  if (tenant_id.empty()) return InvalidArgument("verification needs a tenant");
  ChainVerifier verifier(key);
  KEEL_RETURN_IF_ERROR(tx.exports().ExportTable(tenant_id, "events", [&](const Json& row) {
    verifier.AddEvent(row);
    return Status::Ok();
  }));
  KEEL_RETURN_IF_ERROR(tx.exports().ExportTable(tenant_id, "audit_heads", [&](const Json& row) {
    verifier.AddHead(row);
    return Status::Ok();
  }));
  return verifier.Finish();
}

Json AuditReportJson(const std::string& tenant_id, const std::vector<ChainReport>& chains) {
  std::string status = "verified";
  int64_t events = 0;
  const ChainReport* first = nullptr;
  Json list = Json::array();
  for (const auto& c : chains) {
    events += c.events;
    if (Rank(c.status) > Rank(status)) status = c.status;
    Json problem = nullptr;
    if (c.status == "tampered") {
      problem = {{"event_id", c.event_id.empty() ? Json(nullptr) : Json(c.event_id)},
                 {"message", c.problem}};
      if (!c.event_id.empty() && c.position > 0) {
        problem["position"] = c.position;
        problem["origin_seq"] = c.origin_seq;
      }
      if (!first || (c.position > 0 && (first->position == 0 || c.position < first->position))) {
        first = &c;
      }
    }
    list.push_back({{"origin", c.origin},
                    {"events", c.events},
                    {"status", c.status},
                    {"signed_after", c.anchor.empty() ? Json(nullptr) : Json(c.anchor)},
                    {"problem", problem}});
  }
  Json problem = nullptr;
  if (first) {
    problem = list[static_cast<size_t>(first - chains.data())]["problem"];
    problem["origin"] = first->origin;
  }
  return {{"tenant_id", tenant_id},
          {"status", status},
          {"events", events},
          {"problem", problem},
          {"chains", list}};
}

}  // namespace keel::store
