-- Event positions and origin_seqs per tenant, so that a tenant's cursors show nothing of
-- the others: tenant_position counts the tenant's events, origin_seq its events of each
-- origin. `position` stays the store-wide key. SQLite cannot drop a table's UNIQUE, so
-- the table is rebuilt; existing events are numbered in the order they were written.
CREATE TABLE events_by_tenant(
  position INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, tenant_id TEXT NOT NULL,
  tenant_position INTEGER NOT NULL, type TEXT NOT NULL, origin TEXT NOT NULL,
  origin_seq INTEGER NOT NULL, agent_id TEXT NOT NULL, session_id TEXT NOT NULL,
  run_id TEXT NOT NULL, payload TEXT NOT NULL, occurred_at INTEGER NOT NULL,
  UNIQUE(tenant_id, tenant_position), UNIQUE(tenant_id, origin, origin_seq));
INSERT INTO events_by_tenant(position, id, tenant_id, tenant_position, type, origin, origin_seq,
                             agent_id, session_id, run_id, payload, occurred_at)
  SELECT position, id, tenant_id, row_number() OVER (PARTITION BY tenant_id ORDER BY position),
         type, origin, row_number() OVER (PARTITION BY tenant_id, origin ORDER BY origin_seq),
         agent_id, session_id, run_id, payload, occurred_at
  FROM events ORDER BY position;
DROP TABLE events;
ALTER TABLE events_by_tenant RENAME TO events;
