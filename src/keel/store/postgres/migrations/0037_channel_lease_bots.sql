-- One node at a time polls a Telegram bot, also when two channels (of two agents, or two
-- tenants) hold the same bot's token: the lease planner (channels/leases.h) leaves a channel
-- whose bot another node polls through another channel to that node. keel_channel_leases
-- returns each lease's bot id too, the digits before '/' in the poll's cursor ("" when none).
DO $$ BEGIN EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema()); END $$;
DROP FUNCTION keel_channel_leases();
CREATE FUNCTION keel_channel_leases()
  RETURNS TABLE(tenant_id text, channel_id text, holder text, held_until bigint, bot text)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT p.tenant_id, p.channel_id, p.holder, p.held_until,
    CASE WHEN p.cursor ~ '^[0-9]+/' THEN split_part(p.cursor, '/', 1) ELSE '' END
    FROM channel_polls p WHERE p.holder <> '' ORDER BY p.channel_id;
END $f$;
REVOKE ALL ON FUNCTION keel_channel_leases() FROM PUBLIC;
