-- Polled channels and the outbox (docs/CHANNELS.md, decisions/0020): each polled channel's
-- place in its platform's update stream and its last poll's failure; and each answer owed to
-- a conversation, from "waiting" for its run to sent, skipped, unknown or dead. Runtime state,
-- as plugin_deliveries: neither exported nor rebuilt from the log.
CREATE TABLE channel_polls(
  tenant_id TEXT NOT NULL, channel_id TEXT PRIMARY KEY REFERENCES channels(id),
  cursor TEXT NOT NULL, error TEXT NOT NULL, updated_at INTEGER NOT NULL);
CREATE TABLE channel_replies(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, channel_id TEXT NOT NULL REFERENCES channels(id),
  agent_id TEXT NOT NULL, session_id TEXT NOT NULL, run_id TEXT NOT NULL,
  delivery_id TEXT NOT NULL, target TEXT NOT NULL, status TEXT NOT NULL, text TEXT NOT NULL,
  parts_sent INTEGER NOT NULL, attempts INTEGER NOT NULL, next_attempt_at INTEGER NOT NULL,
  origin TEXT NOT NULL, error TEXT NOT NULL, created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL);
CREATE UNIQUE INDEX channel_replies_delivery ON channel_replies(channel_id, delivery_id);
CREATE INDEX channel_replies_channel ON channel_replies(tenant_id, channel_id, id);
CREATE INDEX channel_replies_due ON channel_replies(status, next_attempt_at);
