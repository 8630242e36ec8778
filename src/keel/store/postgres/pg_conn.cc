#include "keel/store/postgres/pg_conn.h"

#include <libpq-fe.h>
#include <poll.h>

#include <cstdlib>

namespace keel::store::postgres {
namespace {

// libpq's messages span lines ("...failed: Connection refused\n\tIs the server running...");
// a Status message is one line.
std::string OneLine(const char* text) {
  std::string out;
  bool space = false;
  for (const char* p = text ? text : ""; *p; ++p) {
    if (*p == '\n' || *p == '\t' || *p == '\r' || *p == ' ') {
      space = !out.empty();
      continue;
    }
    if (space) out += ' ';
    space = false;
    out += *p;
  }
  return out;
}

Status StatusFromSqlState(const std::string& state, std::string message) {
  auto cls = [&](const char* c) { return state.compare(0, 2, c) == 0; };
  if (cls("08") || cls("53") || cls("40") || cls("57") || state == "55P03") {
    return Unavailable(std::move(message));  // connection, resources, serialization, shutdown
  }
  if (cls("23")) return Conflict(std::move(message));
  if (cls("22")) return InvalidArgument(std::move(message));
  return Internal(std::move(message));
}

}  // namespace

Rows& Rows::operator=(Rows&& o) noexcept {
  if (this != &o) {
    if (r_) PQclear(r_);
    r_ = o.r_;
    o.r_ = nullptr;
  }
  return *this;
}

Rows::~Rows() {
  if (r_) PQclear(r_);
}

int Rows::size() const { return r_ ? PQntuples(r_) : 0; }

std::string Rows::Text(int row, int col) const {
  if (PQgetisnull(r_, row, col)) return {};
  return std::string(PQgetvalue(r_, row, col), PQgetlength(r_, row, col));
}

int64_t Rows::Int(int row, int col) const {
  if (PQgetisnull(r_, row, col)) return 0;
  return std::strtoll(PQgetvalue(r_, row, col), nullptr, 10);
}

bool Rows::IsNull(int row, int col) const { return PQgetisnull(r_, row, col) != 0; }

std::optional<int64_t> Rows::OptInt(int row, int col) const {
  if (IsNull(row, col)) return std::nullopt;
  return Int(row, col);
}

int64_t Rows::affected() const {
  const char* n = r_ ? PQcmdTuples(r_) : "";
  return *n ? std::strtoll(n, nullptr, 10) : 0;
}

namespace {
// The two-key form of advisory locks, (class, hashtext(tenant)): its key space is apart from
// the one-key locks (the migration lock). Two tenants whose ids hash alike share a lock, which
// costs only concurrency.
constexpr const char* kLockTenant = "SELECT pg_advisory_xact_lock(7021802, hashtext($1))";
constexpr const char* kTryLockTenant = "SELECT pg_try_advisory_xact_lock(7021802, hashtext($1))";
}  // namespace

void PgSql::BeginTransaction(bool write) {
  bound_tenant_.reset();
  write_ = write;
  locked_.clear();
  unit_locked_.clear();
  unit_tenants_.clear();
  busy_.clear();
  waits_allowed_at_ = UINT64_MAX;
  unchanged_ = Conn::Failure{};
  conn_.ClearFailure();
}

Status PgSql::LockFirst(const std::set<std::string>& tenants) {
  for (const std::string& t : tenants) {  // std::set: one order on every node
    KEEL_RETURN_IF_ERROR(conn_.Send(kLockTenant, P(t)));
    locked_.insert(t);
  }
  return Status::Ok();
}

void PgSql::BeginUnit() {
  unit_locked_.clear();
  unit_tenants_.clear();
  busy_.clear();
}

void PgSql::UnitRolledBack() {
  for (const std::string& t : unit_locked_) locked_.erase(t);
  unit_locked_.clear();
  bound_tenant_.reset();
}

Status PgSql::LockTenant(const std::string& tenant_id) {
  if (locked_.empty() && conn_.statements() == waits_allowed_at_) {
    // Nothing held, nothing run: waiting here cannot close a cycle.
    KEEL_RETURN_IF_ERROR(conn_.Send(kLockTenant, P(tenant_id)));
  } else {
    KEEL_ASSIGN_OR_RETURN(Rows got, conn_.Query(kTryLockTenant, P(tenant_id)));
    if (got.empty() || got.Text(0, 0) != "t") {
      busy_ = tenant_id;
      return Unavailable("tenant " + tenant_id + " is being written by another node");
    }
  }
  locked_.insert(tenant_id);
  unit_locked_.insert(tenant_id);
  return Status::Ok();
}

Status PgSql::BindTenant(const std::string& tenant_id) {
  if (write_) {
    unit_tenants_.insert(tenant_id);
    if (!locked_.count(tenant_id)) KEEL_RETURN_IF_ERROR(LockTenant(tenant_id));
  }
  if (bound_tenant_ && *bound_tenant_ == tenant_id) return Status::Ok();
  static const std::string kSql = "SELECT set_config('app.tenant_id', $1, true)";
  KEEL_RETURN_IF_ERROR(conn_.Send(kSql, P(tenant_id)));
  bound_tenant_ = tenant_id;
  return Status::Ok();
}

Result<std::unique_ptr<Conn>> Conn::Open(const std::string& url) {
  // Later keywords win: the URL (expanded from dbname) may override the defaults before it.
  // TCP keepalives and tcp_user_timeout bound how long a call waits on a server that stopped
  // answering (a partition, a frozen host): the connection then fails as lost.
  const char* keys[] = {"connect_timeout", "fallback_application_name", "keepalives",
                        "keepalives_idle", "keepalives_interval", "keepalives_count",
                        "tcp_user_timeout", "dbname", nullptr};
  const char* values[] = {"5", "keel", "1", "10", "5", "3", "30000", url.c_str(), nullptr};
  PGconn* c = PQconnectdbParams(keys, values, /*expand_dbname=*/1);
  if (!c) return Unavailable("cannot connect to PostgreSQL: out of memory");
  if (PQstatus(c) != CONNECTION_OK) {
    const char* host = PQhost(c);
    const char* port = PQport(c);
    std::string where = std::string(host && *host ? host : "(default host)") + ":" +
                        (port && *port ? port : "5432");
    Status st =
        Unavailable("cannot connect to PostgreSQL at " + where + ": " + OneLine(PQerrorMessage(c)));
    PQfinish(c);
    return st;
  }
  std::unique_ptr<Conn> conn(new Conn(c));
  // Notices (e.g. "relation already exists, skipping") are not errors; keep them off stderr.
  PQsetNoticeProcessor(
      c, [](void*, const char*) {}, nullptr);
  return conn;
}

Conn::~Conn() { PQfinish(c_); }

bool Conn::broken() const { return PQstatus(c_) != CONNECTION_OK; }

bool Conn::Alive() {
  ReadUnanswered();
  if (broken()) return false;
  pollfd pfd{PQsocket(c_), POLLIN, 0};
  if (::poll(&pfd, 1, 0) > 0) (void)PQconsumeInput(c_);
  return !broken();
}

bool Conn::in_failed_transaction() const { return PQtransactionStatus(c_) == PQTRANS_INERROR; }

bool Conn::idle() const {
  // An unanswered COMMIT ends any transaction, committed or (after a failure) rolled back.
  return !broken() && (unanswered_ || PQtransactionStatus(c_) == PQTRANS_IDLE);
}

Status Conn::CommitUnanswered() {
  KEEL_RETURN_IF_ERROR(Flush());
  ++statements_;
  if (PQenterPipelineMode(c_) != 1 ||
      PQsendQueryParams(c_, "COMMIT", 0, nullptr, nullptr, nullptr, nullptr, 0) != 1 ||
      PQpipelineSync(c_) != 1 || PQflush(c_) != 0) {
    Status st = Unavailable("postgres: cannot send COMMIT: " + OneLine(PQerrorMessage(c_)));
    (void)PQexitPipelineMode(c_);
    return st;
  }
  unanswered_ = true;
  return Status::Ok();
}

void Conn::ReadUnanswered() {
  if (!unanswered_) return;
  unanswered_ = false;
  // The COMMIT's result and the NULL that ends it, then the sync's.
  while (PGresult* r = PQgetResult(c_)) PQclear(r);
  while (PGresult* r = PQgetResult(c_)) {
    bool sync = PQresultStatus(r) == PGRES_PIPELINE_SYNC;
    PQclear(r);
    if (sync) break;
  }
  (void)PQexitPipelineMode(c_);
}

std::string Conn::Describe() const {
  const char* host = PQhost(c_);
  const char* port = PQport(c_);
  const char* db = PQdb(c_);
  return std::string(host ? host : "") + ":" + (port ? port : "") + "/" + (db ? db : "");
}

int Conn::Socket() const { return PQsocket(c_); }

std::string Conn::QuoteLiteral(const std::string& text) const {
  char* q = PQescapeLiteral(c_, text.data(), text.size());
  if (!q) return "''";
  std::string out(q);
  PQfreemem(q);
  return out;
}

int Conn::BackendPid() const { return PQbackendPID(c_); }

bool Conn::ConsumeInput() { return PQconsumeInput(c_) == 1 && !broken(); }

std::vector<Conn::Notification> Conn::TakeNotifications() {
  std::vector<Notification> out;
  while (PGnotify* n = PQnotifies(c_)) {
    out.push_back(Notification{n->relname ? n->relname : "", n->extra ? n->extra : "", n->be_pid});
    PQfreemem(n);
  }
  return out;
}

Result<Rows> Conn::Finish(PGresult* r, std::string_view what) {
  Rows rows(r);
  ExecStatusType status = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
  if (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK) return rows;
  if (broken()) {
    return Unavailable(std::string(what) +
                       ": connection to PostgreSQL lost: " + OneLine(PQerrorMessage(c_)));
  }
  const char* state = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
  const char* primary = r ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
  std::string message = std::string(what) + ": " + OneLine(primary ? primary : PQerrorMessage(c_));
  if (!state) return Internal(std::move(message));
  return StatusFromSqlState(state, std::move(message));
}

Status Conn::Exec(const char* sql) {
  ReadUnanswered();
  ++statements_;
  KEEL_RETURN_IF_ERROR(Flush());
  return Finish(PQexec(c_, sql), "postgres").status();
}

namespace {

// libpq text parameters end at the first NUL byte; refuse rather than store a truncated value.
Status CheckParams(const Params& params, std::vector<const char*>& out) {
  out.reserve(params.values().size());
  for (const auto& v : params.values()) {
    if (v && v->find('\0') != std::string::npos) {
      return InvalidArgument("text containing a NUL character (\\u0000) cannot be stored");
    }
    out.push_back(v ? v->c_str() : nullptr);
  }
  return Status::Ok();
}

}  // namespace

Result<std::string> Conn::Prepared(const std::string& sql) {
  auto it = prepared_.find(sql);
  if (it == prepared_.end()) {
    KEEL_RETURN_IF_ERROR(Flush());
    std::string name = "keel_" + std::to_string(prepared_.size() + 1);
    KEEL_RETURN_IF_ERROR(
        Finish(PQprepare(c_, name.c_str(), sql.c_str(), 0, nullptr), "postgres prepare").status());
    it = prepared_.emplace(sql, std::move(name)).first;
  }
  return it->second;
}

Status Conn::BeforeWait() {
  if (!before_wait_ || in_before_wait_) return Status::Ok();
  in_before_wait_ = true;
  Status st = before_wait_();
  in_before_wait_ = false;
  return st;
}

Result<Rows> Conn::Query(const std::string& sql, const Params& params) {
  ReadUnanswered();
  KEEL_RETURN_IF_ERROR(BeforeWait());
  if (!pending_.empty()) {
    // Behind queued statements: send this one with them and collect all in one round trip.
    std::optional<Rows> rows;
    KEEL_RETURN_IF_ERROR(Send(sql, params, [&rows](Rows& r) { rows.emplace(std::move(r)); }));
    KEEL_RETURN_IF_ERROR(Flush());
    if (rows) return std::move(*rows);
    return Internal("postgres: a pipelined statement returned no result");
  }
  ++statements_;
  std::vector<const char*> values;
  KEEL_RETURN_IF_ERROR(CheckParams(params, values));
  KEEL_ASSIGN_OR_RETURN(std::string name, Prepared(sql));
  auto rows = Finish(PQexecPrepared(c_, name.c_str(), static_cast<int>(values.size()),
                                    values.data(), nullptr, nullptr, 0),
                     "postgres");
  if (!rows.ok()) return Failed(rows.status(), mark_);
  return rows;
}

Status Conn::Failed(Status st, int mark) {
  if (failure_.mark < 0 && !broken()) failure_ = Failure{mark, st};
  return st;
}

namespace {
// Statements queued before a flush is forced: keeps what the server sends back small enough
// for the sockets' buffers, so a blocking connection cannot deadlock mid-pipeline.
constexpr size_t kMaxPipelined = 64;
}  // namespace

Status Conn::Send(const std::string& sql, const Params& params, ResultFn on_result) {
  ReadUnanswered();
  ++statements_;
  std::vector<const char*> values;
  KEEL_RETURN_IF_ERROR(CheckParams(params, values));
  KEEL_ASSIGN_OR_RETURN(std::string name, Prepared(sql));
  if (PQpipelineStatus(c_) == PQ_PIPELINE_OFF && PQenterPipelineMode(c_) != 1) {
    return Unavailable("postgres: cannot enter pipeline mode: " + OneLine(PQerrorMessage(c_)));
  }
  if (PQsendQueryPrepared(c_, name.c_str(), static_cast<int>(values.size()), values.data(),
                          nullptr, nullptr, 0) != 1) {
    Status st = Unavailable("postgres: cannot send a statement: " + OneLine(PQerrorMessage(c_)));
    pending_.clear();
    (void)PQexitPipelineMode(c_);
    return st;
  }
  pending_.emplace_back(mark_, std::move(on_result));
  if (pending_.size() >= kMaxPipelined) return Flush();
  return Status::Ok();
}

Status Conn::Flush() {
  ReadUnanswered();
  KEEL_RETURN_IF_ERROR(BeforeWait());
  if (pending_.empty()) return Status::Ok();
  std::vector<std::pair<int, ResultFn>> pending = std::move(pending_);
  pending_.clear();
  Status first;
  if (PQpipelineSync(c_) != 1) {
    first = Unavailable("postgres: cannot send a pipeline: " + OneLine(PQerrorMessage(c_)));
  }
  for (size_t i = 0; i < pending.size(); ++i) {
    PGresult* r = PQgetResult(c_);
    if (!r) {  // the connection failed: nothing more will come
      if (first.ok()) {
        first = Unavailable("postgres: connection to PostgreSQL lost: " +
                            OneLine(PQerrorMessage(c_)));
      }
      break;
    }
    if (PQresultStatus(r) == PGRES_PIPELINE_ABORTED) {
      PQclear(r);  // skipped after an earlier failure
    } else {
      auto rows = Finish(r, "postgres");
      if (!rows.ok()) {
        Status failed = Failed(rows.status(), pending[i].first);
        if (first.ok()) first = std::move(failed);
      } else if (pending[i].second) {
        pending[i].second(*rows);
      }
    }
    while (PGresult* extra = PQgetResult(c_)) PQclear(extra);  // up to the NULL that ends it
  }
  // The sync's own result, then back to ordinary mode.
  while (PGresult* r = PQgetResult(c_)) {
    bool sync = PQresultStatus(r) == PGRES_PIPELINE_SYNC;
    PQclear(r);
    if (sync) break;
  }
  if (PQexitPipelineMode(c_) != 1 && first.ok()) {
    first = Unavailable("postgres: cannot leave pipeline mode: " + OneLine(PQerrorMessage(c_)));
  }
  return first;
}

Result<Rows> Conn::QueryOnce(const std::string& sql, const Params& params) {
  ReadUnanswered();
  ++statements_;
  KEEL_RETURN_IF_ERROR(Flush());
  std::vector<const char*> values;
  KEEL_RETURN_IF_ERROR(CheckParams(params, values));
  return Finish(PQexecParams(c_, sql.c_str(), static_cast<int>(values.size()), nullptr,
                             values.data(), nullptr, nullptr, 0),
                "postgres");
}

}  // namespace keel::store::postgres
