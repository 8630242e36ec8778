-- Channels (docs/CHANNELS.md): how an agent is reached from outside the API; each channel's
-- conversations, one session each ((channel_id, conversation) is unique, so two deliveries of
-- a new conversation open one session); and the deliveries it took, each with the session it
-- went to ((channel_id, delivery_id) is unique, so a delivery again goes where it went). A delivery names only its channel:
-- keel_channel_tenant tells the runtime whose it is, and nothing else.
DO $$ BEGIN EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema()); END $$;
CREATE TABLE channels(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
  agent_id TEXT COLLATE "C" NOT NULL, kind TEXT COLLATE "C" NOT NULL,
  name TEXT COLLATE "C" NOT NULL, settings TEXT NOT NULL, enabled BIGINT NOT NULL,
  created_by TEXT COLLATE "C" NOT NULL, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL);
CREATE UNIQUE INDEX channels_agent_name ON channels(tenant_id, agent_id, name);
CREATE INDEX channels_agent ON channels(tenant_id, agent_id, id);
CREATE TABLE channel_conversations(
  tenant_id TEXT COLLATE "C" NOT NULL,
  channel_id TEXT COLLATE "C" NOT NULL REFERENCES channels(id),
  conversation TEXT COLLATE "C" NOT NULL, session_id TEXT COLLATE "C" NOT NULL,
  created_at BIGINT NOT NULL, PRIMARY KEY(channel_id, conversation));
CREATE TABLE channel_deliveries(
  tenant_id TEXT COLLATE "C" NOT NULL,
  channel_id TEXT COLLATE "C" NOT NULL REFERENCES channels(id),
  delivery_id TEXT COLLATE "C" NOT NULL, session_id TEXT COLLATE "C" NOT NULL,
  created_at BIGINT NOT NULL, PRIMARY KEY(channel_id, delivery_id));
ALTER TABLE channels ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON channels
  USING (tenant_id = current_setting('app.tenant_id', true))
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true));
ALTER TABLE channel_conversations ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON channel_conversations
  USING (tenant_id = current_setting('app.tenant_id', true))
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true));
ALTER TABLE channel_deliveries ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON channel_deliveries
  USING (tenant_id = current_setting('app.tenant_id', true))
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true));
CREATE FUNCTION keel_channel_tenant(channel_id text) RETURNS text
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS 'SELECT tenant_id FROM channels WHERE id = $1';
REVOKE ALL ON FUNCTION keel_channel_tenant(text) FROM PUBLIC;
