-- Polled channels and the outbox (docs/CHANNELS.md, decisions/0020): each polled channel's
-- place in its platform's update stream and its last poll's failure; and each answer owed to
-- a conversation, from "waiting" for its run to sent, skipped, unknown or dead. Runtime state,
-- as plugin_deliveries: neither exported nor rebuilt from the log. The leader finds what to poll
-- and what to send across tenants through keel_polled_channels and keel_due_replies, which
-- return keys and nothing else.
DO $$ BEGIN EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema()); END $$;
CREATE TABLE channel_polls(
  tenant_id TEXT COLLATE "C" NOT NULL,
  channel_id TEXT COLLATE "C" PRIMARY KEY REFERENCES channels(id),
  cursor TEXT NOT NULL, error TEXT NOT NULL, updated_at BIGINT NOT NULL);
CREATE TABLE channel_replies(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL,
  channel_id TEXT COLLATE "C" NOT NULL REFERENCES channels(id),
  agent_id TEXT COLLATE "C" NOT NULL, session_id TEXT COLLATE "C" NOT NULL,
  run_id TEXT COLLATE "C" NOT NULL, delivery_id TEXT COLLATE "C" NOT NULL,
  target TEXT NOT NULL, status TEXT COLLATE "C" NOT NULL, text TEXT NOT NULL,
  parts_sent BIGINT NOT NULL, attempts BIGINT NOT NULL, next_attempt_at BIGINT NOT NULL,
  origin TEXT COLLATE "C" NOT NULL, error TEXT NOT NULL, created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL);
CREATE UNIQUE INDEX channel_replies_delivery ON channel_replies(channel_id, delivery_id);
CREATE INDEX channel_replies_channel ON channel_replies(tenant_id, channel_id, id);
CREATE INDEX channel_replies_due ON channel_replies(status, next_attempt_at)
  WHERE status IN ('waiting', 'pending', 'sending');
ALTER TABLE channel_polls ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON channel_polls
  USING (tenant_id = current_setting('app.tenant_id', true))
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true));
ALTER TABLE channel_replies ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON channel_replies
  USING (tenant_id = current_setting('app.tenant_id', true))
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true));
CREATE FUNCTION keel_polled_channels()
  RETURNS TABLE(tenant_id text, id text)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT c.tenant_id, c.id FROM channels c
    WHERE c.kind IN ('telegram', 'discord') AND c.enabled = 1 ORDER BY c.id;
END $f$;
REVOKE ALL ON FUNCTION keel_polled_channels() FROM PUBLIC;
CREATE FUNCTION keel_due_replies(now_ms bigint, node text, max_rows bigint)
  RETURNS TABLE(tenant_id text, id text)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT o.tenant_id, o.id FROM channel_replies o
    WHERE o.status IN ('waiting', 'pending', 'sending') AND (
      (o.status = 'pending' AND o.next_attempt_at <= $1) OR
      (o.status = 'sending' AND (o.next_attempt_at <= $1 OR o.origin = $2)) OR
      (o.status = 'waiting' AND EXISTS (SELECT 1 FROM runs r WHERE r.tenant_id = o.tenant_id
         AND r.id = o.run_id AND r.status IN ('done', 'failed', 'cancelled'))))
    ORDER BY o.next_attempt_at, o.id LIMIT $3;
END $f$;
REVOKE ALL ON FUNCTION keel_due_replies(bigint, text, bigint) FROM PUBLIC;
