-- Compaction: summaries that stand for a session's older messages in later contexts.
CREATE TABLE compactions(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL REFERENCES tenants(id),
  session_id TEXT NOT NULL REFERENCES sessions(id), run_id TEXT NOT NULL,
  last_message_id TEXT NOT NULL, summary TEXT NOT NULL, messages INTEGER NOT NULL,
  tokens_before INTEGER NOT NULL, tokens_after INTEGER NOT NULL, created_at INTEGER NOT NULL);
CREATE INDEX compactions_session ON compactions(tenant_id, session_id, id);
