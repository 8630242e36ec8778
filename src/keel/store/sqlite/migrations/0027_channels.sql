-- Channels (docs/CHANNELS.md): how an agent is reached from outside the API; each channel's
-- conversations, one session each ((channel_id, conversation) is unique, so two deliveries of
-- a new conversation open one session); and the deliveries it took, each with the session it
-- went to ((channel_id, delivery_id) is unique, so a delivery again goes where it went).
CREATE TABLE channels(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL REFERENCES tenants(id), agent_id TEXT NOT NULL,
  kind TEXT NOT NULL, name TEXT NOT NULL, settings TEXT NOT NULL, enabled INTEGER NOT NULL,
  created_by TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);
CREATE UNIQUE INDEX channels_agent_name ON channels(tenant_id, agent_id, name);
CREATE INDEX channels_agent ON channels(tenant_id, agent_id, id);
CREATE TABLE channel_conversations(
  tenant_id TEXT NOT NULL, channel_id TEXT NOT NULL REFERENCES channels(id),
  conversation TEXT NOT NULL, session_id TEXT NOT NULL, created_at INTEGER NOT NULL,
  PRIMARY KEY(channel_id, conversation));
CREATE TABLE channel_deliveries(
  tenant_id TEXT NOT NULL, channel_id TEXT NOT NULL REFERENCES channels(id),
  delivery_id TEXT NOT NULL, session_id TEXT NOT NULL, created_at INTEGER NOT NULL,
  PRIMARY KEY(channel_id, delivery_id));
