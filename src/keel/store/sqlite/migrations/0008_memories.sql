-- Agents' memories with their full-text index (FTS5 over the text and the tags, each
-- agent with words of its own through the keel_agent tokenizer, kept in step by triggers;
-- see sqlite_memory.cc), and each agent's working memory. automerge 2 (FTS5's default is
-- 4) keeps fewer index segments for a search to walk, at no measurable cost to writes.
CREATE TABLE memories(
  seq INTEGER PRIMARY KEY, id TEXT NOT NULL, tenant_id TEXT NOT NULL REFERENCES tenants(id),
  agent_id TEXT NOT NULL REFERENCES agents(id), text TEXT NOT NULL, tags TEXT NOT NULL,
  source TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
  scope TEXT NOT NULL DEFAULT '',
  body TEXT GENERATED ALWAYS AS ('k' || hex(agent_id) || ' ' || text) VIRTUAL,
  fts_rowid INTEGER GENERATED ALWAYS AS (-seq) VIRTUAL,
  UNIQUE(tenant_id, id));
CREATE INDEX memories_recent ON memories(tenant_id, agent_id, updated_at, id);
CREATE VIRTUAL TABLE memories_fts USING fts5(body, scope, content='memories',
  content_rowid='fts_rowid', tokenize='keel_agent');
INSERT INTO memories_fts(memories_fts, rank) VALUES('automerge', 2);
CREATE TRIGGER memories_fts_insert AFTER INSERT ON memories BEGIN
  INSERT INTO memories_fts(rowid, body, scope) VALUES(new.fts_rowid, new.body, new.scope);
END;
CREATE TRIGGER memories_fts_delete AFTER DELETE ON memories BEGIN
  INSERT INTO memories_fts(memories_fts, rowid, body, scope)
    VALUES('delete', old.fts_rowid, old.body, old.scope);
END;
CREATE TRIGGER memories_fts_update AFTER UPDATE ON memories BEGIN
  INSERT INTO memories_fts(memories_fts, rowid, body, scope)
    VALUES('delete', old.fts_rowid, old.body, old.scope);
  INSERT INTO memories_fts(rowid, body, scope) VALUES(new.fts_rowid, new.body, new.scope);
END;
CREATE TABLE working_memories(
  tenant_id TEXT NOT NULL REFERENCES tenants(id), agent_id TEXT NOT NULL REFERENCES agents(id),
  text TEXT NOT NULL, updated_at INTEGER NOT NULL, PRIMARY KEY(tenant_id, agent_id));
