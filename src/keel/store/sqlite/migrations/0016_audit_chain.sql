-- The audit chain (store/audit.h): each event's hash, each chain's signed head. Events
-- from before it are hashed at the first start (BackfillChains), which needs the key.
ALTER TABLE events ADD COLUMN hash TEXT NOT NULL DEFAULT '';
CREATE INDEX events_unhashed ON events(position) WHERE hash = '';
CREATE TABLE audit_heads(
  tenant_id TEXT NOT NULL, origin TEXT NOT NULL, last_id TEXT NOT NULL,
  last_seq INTEGER NOT NULL, hash TEXT NOT NULL, anchor TEXT NOT NULL, mac TEXT NOT NULL,
  PRIMARY KEY(tenant_id, origin));
