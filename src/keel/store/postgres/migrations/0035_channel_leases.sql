-- A lease per polled channel (docs/CHANNELS.md): the node that polls a channel (or registers
-- its command) holds its row until `held_until` and renews it; another node takes a channel
-- whose lease ran out, so a stopped or dead node's channels move on, and the nodes of a fleet
-- share the channels between them. One node at a time polls a bot (Telegram answers a second
-- poller 409). Each node reads who holds what across tenants through keel_channel_leases,
-- which returns keys, node origins and times, nothing else.
DO $$ BEGIN EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema()); END $$;
ALTER TABLE channel_polls ADD COLUMN holder TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE channel_polls ADD COLUMN held_until BIGINT NOT NULL DEFAULT 0;
CREATE FUNCTION keel_channel_leases()
  RETURNS TABLE(tenant_id text, channel_id text, holder text, held_until bigint)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT p.tenant_id, p.channel_id, p.holder, p.held_until FROM channel_polls p
    WHERE p.holder <> '' ORDER BY p.channel_id;
END $f$;
REVOKE ALL ON FUNCTION keel_channel_leases() FROM PUBLIC;
