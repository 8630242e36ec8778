-- Introspection: a session's description, and the sessions whose idle introspection is
-- due.
ALTER TABLE sessions ADD COLUMN description TEXT NOT NULL DEFAULT '';
CREATE TABLE introspection_due(
  tenant_id TEXT NOT NULL, session_id TEXT NOT NULL REFERENCES sessions(id),
  agent_id TEXT NOT NULL, due_at INTEGER NOT NULL, PRIMARY KEY(tenant_id, session_id));
CREATE INDEX introspection_due_at ON introspection_due(due_at);
