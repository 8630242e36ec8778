-- Agents' memories, searchable through a 'simple' tsvector of their words (GIN; see
-- postgres_memory.cc), and each agent's working memory. seq orders writes (the search's
-- recency bound): a new value on every insert and update. Words are split where
-- memory::ParseQuery splits a query (query.cc, IsWordChar): at every character but ASCII
-- letters and digits and the letters beyond ASCII, whatever the database's locale.
CREATE SEQUENCE memories_seq;
CREATE TABLE memories(
  id TEXT COLLATE "C" NOT NULL, tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
  agent_id TEXT COLLATE "C" NOT NULL REFERENCES agents(id), text TEXT NOT NULL,
  tags TEXT NOT NULL, source TEXT COLLATE "C" NOT NULL, created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL, seq BIGINT NOT NULL DEFAULT nextval('memories_seq'),
  tsv tsvector GENERATED ALWAYS AS
    (to_tsvector('simple', regexp_replace(text,
      '[^0-9A-Za-z\u00AA\u00B2\u00B3\u00B5\u00B9\u00BA\u00BC-\u00BE\u00C0-\u00D6\u00D8-\u00F6'
      '\u00F8-\u1FFF\u2070-\U0010FFFF]+', ' ', 'g'))) STORED,
  PRIMARY KEY(tenant_id, id));
ALTER SEQUENCE memories_seq OWNED BY memories.seq;
CREATE INDEX memories_recent ON memories(tenant_id, agent_id, updated_at, id);
CREATE INDEX memories_seq_order ON memories(tenant_id, agent_id, seq);
CREATE INDEX memories_words ON memories USING GIN(tsv);
CREATE TABLE working_memories(
  tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
  agent_id TEXT COLLATE "C" NOT NULL REFERENCES agents(id), text TEXT NOT NULL,
  updated_at BIGINT NOT NULL, PRIMARY KEY(tenant_id, agent_id));
ALTER TABLE memories ENABLE ROW LEVEL SECURITY;
ALTER TABLE memories FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON memories
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE working_memories ENABLE ROW LEVEL SECURITY;
ALTER TABLE working_memories FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON working_memories
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
