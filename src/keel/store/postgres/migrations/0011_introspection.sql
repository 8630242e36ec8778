-- Introspection: a session's description, and the sessions whose idle introspection is
-- due.
ALTER TABLE sessions ADD COLUMN description TEXT COLLATE "C" NOT NULL DEFAULT '';
CREATE TABLE introspection_due(
  tenant_id TEXT COLLATE "C" NOT NULL, session_id TEXT COLLATE "C" NOT NULL REFERENCES sessions(id),
  agent_id TEXT COLLATE "C" NOT NULL, due_at BIGINT NOT NULL, PRIMARY KEY(tenant_id, session_id));
CREATE INDEX introspection_due_at ON introspection_due(due_at);
ALTER TABLE introspection_due ENABLE ROW LEVEL SECURITY;
ALTER TABLE introspection_due FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON introspection_due
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
