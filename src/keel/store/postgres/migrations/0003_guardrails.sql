-- The gateway's guardrails: policies, emergency stops, approvals, and who asked.
ALTER TABLE runs ADD COLUMN requested_by TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN caller_role TEXT COLLATE "C" NOT NULL DEFAULT 'owner';
CREATE TABLE policies(
  tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id), scope TEXT COLLATE "C" NOT NULL,
  body TEXT NOT NULL, updated_at BIGINT NOT NULL, PRIMARY KEY(tenant_id, scope));
CREATE TABLE emergency_stops(
  tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id), agent_id TEXT COLLATE "C" NOT NULL,
  reason TEXT NOT NULL, created_by TEXT NOT NULL, created_at BIGINT NOT NULL,
  PRIMARY KEY(tenant_id, agent_id));
CREATE TABLE approvals(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
  run_id TEXT COLLATE "C" NOT NULL REFERENCES runs(id), session_id TEXT COLLATE "C" NOT NULL,
  agent_id TEXT COLLATE "C" NOT NULL, call_id TEXT COLLATE "C" NOT NULL,
  tool TEXT COLLATE "C" NOT NULL, arguments TEXT NOT NULL, amended_arguments TEXT NOT NULL,
  reason TEXT NOT NULL, status TEXT COLLATE "C" NOT NULL, requested_by TEXT NOT NULL,
  decided_by TEXT NOT NULL, decision_reason TEXT NOT NULL, created_at BIGINT NOT NULL,
  expires_at BIGINT NOT NULL, decided_at BIGINT, UNIQUE(run_id, call_id));
CREATE INDEX approvals_tenant_status ON approvals(tenant_id, status, id);
CREATE INDEX approvals_pending ON approvals(status, expires_at);
CREATE TABLE standing_approvals(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
  agent_id TEXT COLLATE "C" NOT NULL, tool TEXT COLLATE "C" NOT NULL,
  arguments_match TEXT NOT NULL, created_by TEXT NOT NULL, approval_id TEXT NOT NULL,
  created_at BIGINT NOT NULL, expires_at BIGINT NOT NULL, revoked_at BIGINT);
CREATE INDEX standing_approvals_lookup ON standing_approvals(tenant_id, agent_id, tool);
ALTER TABLE policies ENABLE ROW LEVEL SECURITY;
ALTER TABLE policies FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON policies
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE emergency_stops ENABLE ROW LEVEL SECURITY;
ALTER TABLE emergency_stops FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON emergency_stops
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE approvals ENABLE ROW LEVEL SECURITY;
ALTER TABLE approvals FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON approvals
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE standing_approvals ENABLE ROW LEVEL SECURITY;
ALTER TABLE standing_approvals FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON standing_approvals
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
