-- Event positions and origin_seqs per tenant, so that a tenant's cursors show nothing of
-- the others: tenant_position counts the tenant's events, origin_seq its events of each
-- origin, both taken with max() under the write lock (PostgresTx::Append), so the
-- per-origin counter rows and the runtime-wide last position go. `position` stays the
-- store-wide key. Existing events are numbered in the order they were written.
ALTER TABLE events DROP CONSTRAINT events_origin_origin_seq_key;
ALTER TABLE events ADD COLUMN tenant_position BIGINT;
UPDATE events e SET tenant_position = n.tenant_position, origin_seq = n.origin_seq
  FROM (SELECT position,
               row_number() OVER (PARTITION BY tenant_id ORDER BY position) AS tenant_position,
               row_number() OVER (PARTITION BY tenant_id, origin ORDER BY origin_seq) AS origin_seq
        FROM events) n
  WHERE e.position = n.position;
ALTER TABLE events ALTER COLUMN tenant_position SET NOT NULL;
ALTER TABLE events ADD UNIQUE (tenant_id, tenant_position);
ALTER TABLE events ADD UNIQUE (tenant_id, origin, origin_seq);
DROP INDEX events_tenant;
DROP FUNCTION keel_last_position();
-- The functions' fixed search_path, as the two-roles migration set it.
DO $$ BEGIN EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema()); END $$;
CREATE OR REPLACE FUNCTION keel_finish_import() RETURNS void
  LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
BEGIN
  PERFORM pg_advisory_xact_lock(7021802329620481);
  PERFORM setval(pg_get_serial_sequence('events', 'position'), max(position)) FROM events
    HAVING count(*) > 0;
END $f$;
DROP TABLE event_origins;
