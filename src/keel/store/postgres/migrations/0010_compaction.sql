-- Compaction: summaries that stand for a session's older messages in later contexts.
CREATE TABLE compactions(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
  session_id TEXT COLLATE "C" NOT NULL REFERENCES sessions(id), run_id TEXT COLLATE "C" NOT NULL,
  last_message_id TEXT COLLATE "C" NOT NULL, summary TEXT NOT NULL, messages BIGINT NOT NULL,
  tokens_before BIGINT NOT NULL, tokens_after BIGINT NOT NULL, created_at BIGINT NOT NULL);
CREATE INDEX compactions_session ON compactions(tenant_id, session_id, id);
ALTER TABLE compactions ENABLE ROW LEVEL SECURITY;
ALTER TABLE compactions FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON compactions
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
