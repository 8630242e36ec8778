-- The kernel's tables.
CREATE TABLE tenants(
  id TEXT PRIMARY KEY, name TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE api_tokens(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL REFERENCES tenants(id), name TEXT NOT NULL,
  role TEXT NOT NULL, hash TEXT NOT NULL UNIQUE, created_at INTEGER NOT NULL, revoked_at INTEGER);
CREATE INDEX api_tokens_tenant ON api_tokens(tenant_id, id);
CREATE TABLE agents(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL REFERENCES tenants(id), name TEXT NOT NULL,
  model TEXT NOT NULL, instructions TEXT NOT NULL, tools TEXT NOT NULL, config TEXT NOT NULL,
  status TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);
CREATE UNIQUE INDEX agents_name ON agents(tenant_id, name) WHERE status != 'deleted';
CREATE INDEX agents_tenant ON agents(tenant_id, id);
CREATE TABLE sessions(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, agent_id TEXT NOT NULL REFERENCES agents(id),
  status TEXT NOT NULL, title TEXT NOT NULL, created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL);
CREATE INDEX sessions_agent ON sessions(tenant_id, agent_id, id);
CREATE TABLE messages(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, session_id TEXT NOT NULL REFERENCES sessions(id),
  run_id TEXT NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
  idempotency_key TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE INDEX messages_session ON messages(session_id, id);
CREATE UNIQUE INDEX messages_idempotency ON messages(session_id, idempotency_key)
  WHERE idempotency_key != '';
CREATE TABLE runs(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, session_id TEXT NOT NULL REFERENCES sessions(id),
  agent_id TEXT NOT NULL, message_id TEXT NOT NULL, status TEXT NOT NULL, attempt INTEGER NOT NULL,
  output TEXT NOT NULL, error TEXT NOT NULL, input_tokens INTEGER NOT NULL,
  output_tokens INTEGER NOT NULL, lease_owner TEXT NOT NULL, lease_expires_at INTEGER NOT NULL,
  cancel_requested INTEGER NOT NULL, created_at INTEGER NOT NULL, started_at INTEGER,
  finished_at INTEGER);
CREATE INDEX runs_session ON runs(session_id, id);
CREATE INDEX runs_session_status ON runs(session_id, status);
CREATE INDEX runs_tenant ON runs(tenant_id, id);
CREATE INDEX runs_status ON runs(status, id);
CREATE INDEX runs_tenant_status ON runs(tenant_id, status);
CREATE TABLE run_steps(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, run_id TEXT NOT NULL REFERENCES runs(id),
  seq INTEGER NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL, input TEXT NOT NULL,
  output TEXT NOT NULL, started_at INTEGER NOT NULL, finished_at INTEGER, UNIQUE(run_id, seq));
CREATE TABLE tool_calls(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, run_id TEXT NOT NULL REFERENCES runs(id),
  step_id TEXT NOT NULL, call_id TEXT NOT NULL, tool TEXT NOT NULL, arguments TEXT NOT NULL,
  effect_class TEXT NOT NULL, effect_key TEXT NOT NULL, status TEXT NOT NULL,
  result TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
  UNIQUE(run_id, call_id));
CREATE TABLE events(
  position INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, tenant_id TEXT NOT NULL,
  type TEXT NOT NULL, origin TEXT NOT NULL, origin_seq INTEGER NOT NULL, agent_id TEXT NOT NULL,
  session_id TEXT NOT NULL, run_id TEXT NOT NULL, payload TEXT NOT NULL,
  occurred_at INTEGER NOT NULL, UNIQUE(origin, origin_seq));
CREATE INDEX events_tenant ON events(tenant_id, position);
