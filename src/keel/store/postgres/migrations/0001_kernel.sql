-- Every text column is COLLATE "C" so comparisons and ORDER BY follow byte order, as SQLite's
-- BINARY collation does (list cursors are the last id). Times and counters are BIGINT like
-- SQLite's 64-bit INTEGER; booleans are 0/1; JSON is stored as text exactly as SqliteTx does.
--
-- The kernel's tables, with row-level security on every tenant-scoped one.
CREATE TABLE tenants(
  id TEXT COLLATE "C" PRIMARY KEY, name TEXT COLLATE "C" NOT NULL, created_at BIGINT NOT NULL);
CREATE TABLE api_tokens(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
  name TEXT COLLATE "C" NOT NULL, role TEXT COLLATE "C" NOT NULL,
  hash TEXT COLLATE "C" NOT NULL UNIQUE, created_at BIGINT NOT NULL, revoked_at BIGINT);
CREATE INDEX api_tokens_tenant ON api_tokens(tenant_id, id);
CREATE TABLE agents(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
  name TEXT COLLATE "C" NOT NULL, model TEXT COLLATE "C" NOT NULL,
  instructions TEXT COLLATE "C" NOT NULL, tools TEXT COLLATE "C" NOT NULL,
  config TEXT COLLATE "C" NOT NULL, status TEXT COLLATE "C" NOT NULL, created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL);
CREATE UNIQUE INDEX agents_name ON agents(tenant_id, name) WHERE status != 'deleted';
CREATE INDEX agents_tenant ON agents(tenant_id, id);
CREATE TABLE sessions(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL,
  agent_id TEXT COLLATE "C" NOT NULL REFERENCES agents(id), status TEXT COLLATE "C" NOT NULL,
  title TEXT COLLATE "C" NOT NULL, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL);
CREATE INDEX sessions_agent ON sessions(tenant_id, agent_id, id);
CREATE TABLE messages(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL,
  session_id TEXT COLLATE "C" NOT NULL REFERENCES sessions(id), run_id TEXT COLLATE "C" NOT NULL,
  role TEXT COLLATE "C" NOT NULL, content TEXT COLLATE "C" NOT NULL,
  idempotency_key TEXT COLLATE "C" NOT NULL, created_at BIGINT NOT NULL);
CREATE INDEX messages_session ON messages(session_id, id);
CREATE UNIQUE INDEX messages_idempotency ON messages(session_id, idempotency_key)
  WHERE idempotency_key != '';
CREATE TABLE runs(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL,
  session_id TEXT COLLATE "C" NOT NULL REFERENCES sessions(id),
  agent_id TEXT COLLATE "C" NOT NULL, message_id TEXT COLLATE "C" NOT NULL,
  status TEXT COLLATE "C" NOT NULL, attempt BIGINT NOT NULL, output TEXT COLLATE "C" NOT NULL,
  error TEXT COLLATE "C" NOT NULL, input_tokens BIGINT NOT NULL, output_tokens BIGINT NOT NULL,
  lease_owner TEXT COLLATE "C" NOT NULL, lease_expires_at BIGINT NOT NULL,
  cancel_requested BIGINT NOT NULL, created_at BIGINT NOT NULL, started_at BIGINT,
  finished_at BIGINT);
CREATE INDEX runs_session ON runs(session_id, id);
CREATE INDEX runs_session_status ON runs(session_id, status);
CREATE INDEX runs_tenant ON runs(tenant_id, id);
CREATE INDEX runs_status ON runs(status, id);
CREATE INDEX runs_tenant_status ON runs(tenant_id, status);
CREATE TABLE run_steps(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL,
  run_id TEXT COLLATE "C" NOT NULL REFERENCES runs(id), seq BIGINT NOT NULL,
  kind TEXT COLLATE "C" NOT NULL, status TEXT COLLATE "C" NOT NULL,
  input TEXT COLLATE "C" NOT NULL, output TEXT COLLATE "C" NOT NULL, started_at BIGINT NOT NULL,
  finished_at BIGINT, UNIQUE(run_id, seq));
CREATE TABLE tool_calls(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL,
  run_id TEXT COLLATE "C" NOT NULL REFERENCES runs(id), step_id TEXT COLLATE "C" NOT NULL,
  call_id TEXT COLLATE "C" NOT NULL, tool TEXT COLLATE "C" NOT NULL,
  arguments TEXT COLLATE "C" NOT NULL, effect_class TEXT COLLATE "C" NOT NULL,
  effect_key TEXT COLLATE "C" NOT NULL, status TEXT COLLATE "C" NOT NULL,
  result TEXT COLLATE "C" NOT NULL, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,
  UNIQUE(run_id, call_id));
CREATE TABLE events(
  position BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, id TEXT COLLATE "C" NOT NULL,
  tenant_id TEXT COLLATE "C" NOT NULL, type TEXT COLLATE "C" NOT NULL,
  origin TEXT COLLATE "C" NOT NULL, origin_seq BIGINT NOT NULL, agent_id TEXT COLLATE "C" NOT NULL,
  session_id TEXT COLLATE "C" NOT NULL, run_id TEXT COLLATE "C" NOT NULL,
  payload TEXT COLLATE "C" NOT NULL, occurred_at BIGINT NOT NULL, UNIQUE(origin, origin_seq));
CREATE INDEX events_tenant ON events(tenant_id, position);
-- The last origin_seq of each origin (a node or device), not tenant data: no row security.
CREATE TABLE event_origins(origin TEXT COLLATE "C" PRIMARY KEY, last_seq BIGINT NOT NULL);

ALTER TABLE tenants ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenants FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenants
  USING (id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');

ALTER TABLE api_tokens ENABLE ROW LEVEL SECURITY;
ALTER TABLE api_tokens FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON api_tokens
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE agents ENABLE ROW LEVEL SECURITY;
ALTER TABLE agents FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON agents
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE sessions ENABLE ROW LEVEL SECURITY;
ALTER TABLE sessions FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON sessions
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE messages ENABLE ROW LEVEL SECURITY;
ALTER TABLE messages FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON messages
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE runs ENABLE ROW LEVEL SECURITY;
ALTER TABLE runs FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON runs
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE run_steps ENABLE ROW LEVEL SECURITY;
ALTER TABLE run_steps FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON run_steps
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE tool_calls ENABLE ROW LEVEL SECURITY;
ALTER TABLE tool_calls FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tool_calls
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE events ENABLE ROW LEVEL SECURITY;
ALTER TABLE events FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON events
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
