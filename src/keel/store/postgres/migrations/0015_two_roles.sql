-- Two roles (docs/decisions/0008-postgres-owner-and-runtime-roles.md): the role that
-- migrates owns the schema; the runtime role owns nothing, so row-level security applies
-- to it without FORCE, while the owner's own statements and the functions below see every
-- row. The policies check app.tenant_id only: no setting opens every tenant's rows. The
-- runtime-wide calls go through these SECURITY DEFINER functions, each returning only what
-- its caller needs (keys, counts, times), never a tenant's contents; EXECUTE is granted to
-- the runtime role alone (MigrateStore). Their search_path is fixed (pg_catalog first, this
-- schema, pg_temp last), so no object another role creates can stand in for one of ours.
DO $$
DECLARE p record;
BEGIN
  FOR p IN SELECT tablename FROM pg_policies
           WHERE schemaname = current_schema() AND policyname = 'tenant_isolation' LOOP
    EXECUTE format('DROP POLICY tenant_isolation ON %I', p.tablename);
    EXECUTE format('CREATE POLICY tenant_isolation ON %1$I '
                   'USING (%2$I = current_setting(''app.tenant_id'', true)) '
                   'WITH CHECK (%2$I = current_setting(''app.tenant_id'', true))',
                   p.tablename, CASE WHEN p.tablename = 'tenants' THEN 'id' ELSE 'tenant_id' END);
    EXECUTE format('ALTER TABLE %I NO FORCE ROW LEVEL SECURITY', p.tablename);
  END LOOP;
  -- pg_catalog, not listed, is searched first; new objects go to the first listed schema.
  EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema());
END $$;

CREATE FUNCTION keel_tenants() RETURNS SETOF tenants
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS 'SELECT * FROM tenants';
-- Only with the token's hash: no listing of tokens.
CREATE FUNCTION keel_active_token(token_hash text) RETURNS SETOF api_tokens
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS 'SELECT * FROM api_tokens WHERE hash = $1 AND revoked_at IS NULL';
-- Two index range scans on (status, id); an OR would scan the whole table.
CREATE FUNCTION keel_claimable_runs(now_ms bigint, max_rows bigint)
  RETURNS TABLE(tenant_id text, id text)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS 'SELECT tenant_id, id FROM (
        SELECT r.tenant_id, r.id FROM runs r WHERE r.status = ''queued''
          AND NOT EXISTS (SELECT 1 FROM runs p WHERE p.session_id = r.session_id
            AND p.status IN (''queued'', ''running'', ''waiting_for_approval'') AND p.id < r.id)
        UNION ALL
        SELECT tenant_id, id FROM runs WHERE status = ''running'' AND lease_expires_at < $1
      ) claimable ORDER BY id LIMIT $2';
CREATE FUNCTION keel_expire_leases(lease_owner text) RETURNS void
  LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT
  AS 'UPDATE runs SET lease_expires_at = 0 WHERE status = ''running'' AND lease_owner = $1';
CREATE FUNCTION keel_renew_leases(lease_owner text, run_ids text[], expires_at bigint)
  RETURNS void
  LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT
  AS 'UPDATE runs SET lease_expires_at = $3
        WHERE id = ANY($2) AND lease_owner = $1 AND status = ''running''';
CREATE FUNCTION keel_last_position() RETURNS bigint
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS 'SELECT coalesce(max(position), 0) FROM events';
CREATE FUNCTION keel_expired_approvals(now_ms bigint, max_rows bigint)
  RETURNS TABLE(tenant_id text, id text)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS 'SELECT tenant_id, id FROM approvals WHERE status = ''pending'' AND expires_at < $1
        ORDER BY expires_at, id LIMIT $2';
CREATE FUNCTION keel_due_deliveries(now_ms bigint, max_rows bigint)
  RETURNS TABLE(tenant_id text, id text)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS 'SELECT tenant_id, id FROM plugin_deliveries WHERE status = ''pending''
        AND next_attempt_at <= $1 ORDER BY next_attempt_at, id LIMIT $2';
CREATE FUNCTION keel_due_schedules(now_ms bigint, max_rows bigint)
  RETURNS TABLE(tenant_id text, id text)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS 'SELECT tenant_id, id FROM schedules WHERE status = ''active'' AND next_fire_at <= $1
        ORDER BY next_fire_at, id LIMIT $2';
CREATE FUNCTION keel_next_fire_at() RETURNS bigint
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS 'SELECT min(next_fire_at) FROM schedules WHERE status = ''active''';
CREATE FUNCTION keel_due_introspections(now_ms bigint, max_rows bigint)
  RETURNS TABLE(tenant_id text, session_id text, agent_id text, due_at bigint)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS 'SELECT tenant_id, session_id, agent_id, due_at FROM introspection_due WHERE due_at <= $1
        ORDER BY due_at, session_id LIMIT $2';
-- The number of cache entries removed: older than `before`, then all but the newest max_entries.
CREATE FUNCTION keel_prune_cache(before bigint, max_entries bigint) RETURNS bigint
  LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
DECLARE expired bigint; oldest bigint;
BEGIN
  WITH d AS (DELETE FROM model_cache WHERE created_at < before RETURNING 1)
    SELECT count(*) INTO expired FROM d;
  WITH d AS (DELETE FROM model_cache WHERE ctid IN (SELECT ctid FROM model_cache
             ORDER BY created_at DESC OFFSET max_entries) RETURNING 1)
    SELECT count(*) INTO oldest FROM d;
  RETURN expired + oldest;
END $f$;
-- Whether a table of this schema holds no row (an import refuses a store with data).
CREATE FUNCTION keel_table_is_empty(table_name text) RETURNS boolean
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
DECLARE empty boolean;
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = current_schema()
                 AND tablename = table_name) THEN
    RAISE EXCEPTION 'no table %', table_name;
  END IF;
  EXECUTE format('SELECT NOT EXISTS (SELECT 1 FROM %I)', table_name) INTO empty;
  RETURN empty;
END $f$;
-- After an import: event positions and each origin's counter continue after the imported
-- events. Under the write lock, so that no other transaction holds a position meanwhile.
CREATE FUNCTION keel_finish_import() RETURNS void
  LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
BEGIN
  PERFORM pg_advisory_xact_lock(7021802329620481);
  PERFORM setval(pg_get_serial_sequence('events', 'position'), max(position)) FROM events
    HAVING count(*) > 0;
  INSERT INTO event_origins(origin, last_seq) SELECT origin, max(origin_seq) FROM events
    GROUP BY origin ON CONFLICT (origin) DO UPDATE SET
    last_seq = GREATEST(event_origins.last_seq, EXCLUDED.last_seq);
END $f$;
DO $$
DECLARE f record;
BEGIN
  FOR f IN SELECT p.oid::regprocedure AS sig FROM pg_proc p
           WHERE p.pronamespace = current_schema()::regnamespace AND p.proname LIKE 'keel\_%' LOOP
    EXECUTE format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f.sig);
  END LOOP;
END $$;
