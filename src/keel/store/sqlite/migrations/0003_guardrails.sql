-- The gateway's guardrails: policies, emergency stops, approvals, and who asked.
ALTER TABLE runs ADD COLUMN requested_by TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN caller_role TEXT NOT NULL DEFAULT 'owner';
CREATE TABLE policies(
  tenant_id TEXT NOT NULL REFERENCES tenants(id), scope TEXT NOT NULL, body TEXT NOT NULL,
  updated_at INTEGER NOT NULL, PRIMARY KEY(tenant_id, scope));
CREATE TABLE emergency_stops(
  tenant_id TEXT NOT NULL REFERENCES tenants(id), agent_id TEXT NOT NULL, reason TEXT NOT NULL,
  created_by TEXT NOT NULL, created_at INTEGER NOT NULL, PRIMARY KEY(tenant_id, agent_id));
CREATE TABLE approvals(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL REFERENCES tenants(id),
  run_id TEXT NOT NULL REFERENCES runs(id), session_id TEXT NOT NULL, agent_id TEXT NOT NULL,
  call_id TEXT NOT NULL, tool TEXT NOT NULL, arguments TEXT NOT NULL,
  amended_arguments TEXT NOT NULL, reason TEXT NOT NULL, status TEXT NOT NULL,
  requested_by TEXT NOT NULL, decided_by TEXT NOT NULL, decision_reason TEXT NOT NULL,
  created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, decided_at INTEGER,
  UNIQUE(run_id, call_id));
CREATE INDEX approvals_tenant_status ON approvals(tenant_id, status, id);
CREATE INDEX approvals_pending ON approvals(status, expires_at);
CREATE TABLE standing_approvals(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL REFERENCES tenants(id), agent_id TEXT NOT NULL,
  tool TEXT NOT NULL, arguments_match TEXT NOT NULL, created_by TEXT NOT NULL,
  approval_id TEXT NOT NULL, created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL,
  revoked_at INTEGER);
CREATE INDEX standing_approvals_lookup ON standing_approvals(tenant_id, agent_id, tool);
