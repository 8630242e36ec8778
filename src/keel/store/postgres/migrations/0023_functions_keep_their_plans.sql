-- The runtime role's functions in PL/pgSQL, which keeps a statement's plan for the session.
-- A SQL function with SECURITY DEFINER or SET is never inlined, and PostgreSQL parses and plans
-- its body on every call: pg_stat_statements measured keel_active_token (one call per request)
-- at 61 us against 5 us for its query alone, and keel_claimable_runs at 741 us against 33 us.
-- CREATE OR REPLACE keeps each function's owner, rights and result type. Where a result column
-- shares a column's name, `#variable_conflict use_column` reads the name as the column.
DO $$
BEGIN
  EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema());
END $$;

CREATE OR REPLACE FUNCTION keel_tenants() RETURNS SETOF tenants
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$ BEGIN RETURN QUERY SELECT * FROM tenants; END $f$;

CREATE OR REPLACE FUNCTION keel_active_token(token_hash text) RETURNS SETOF api_tokens
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
BEGIN
  RETURN QUERY SELECT * FROM api_tokens WHERE hash = token_hash AND revoked_at IS NULL;
END $f$;

CREATE OR REPLACE FUNCTION keel_claimable_runs(now_ms bigint, max_rows bigint)
  RETURNS TABLE(tenant_id text, id text)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT turns.tenant_id, turns.id FROM (
      SELECT c.tenant_id, c.id, row_number() OVER (PARTITION BY c.tenant_id ORDER BY c.id) AS turn
      FROM (
        SELECT r.tenant_id, r.id FROM runs r WHERE r.status = 'queued'
          AND NOT EXISTS (SELECT 1 FROM runs p WHERE p.session_id = r.session_id
            AND p.status IN ('queued', 'running', 'waiting_for_approval') AND p.id < r.id)
        UNION ALL
        SELECT r.tenant_id, r.id FROM runs r WHERE r.status = 'running' AND r.lease_expires_at < $1
      ) c
    ) turns ORDER BY turns.turn, turns.id LIMIT $2;
END $f$;

CREATE OR REPLACE FUNCTION keel_expire_leases(lease_owner text) RETURNS void
  LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
BEGIN
  UPDATE runs SET lease_expires_at = 0 WHERE status = 'running' AND lease_owner = $1;
END $f$;

CREATE OR REPLACE FUNCTION keel_renew_leases(lease_owner text, run_ids text[], expires_at bigint)
  RETURNS void
  LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
BEGIN
  UPDATE runs SET lease_expires_at = $3
    WHERE id = ANY($2) AND lease_owner = $1 AND status = 'running';
END $f$;

CREATE OR REPLACE FUNCTION keel_expired_approvals(now_ms bigint, max_rows bigint)
  RETURNS TABLE(tenant_id text, id text)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT a.tenant_id, a.id FROM approvals a
    WHERE a.status = 'pending' AND a.expires_at < $1 ORDER BY a.expires_at, a.id LIMIT $2;
END $f$;

CREATE OR REPLACE FUNCTION keel_due_deliveries(now_ms bigint, max_rows bigint)
  RETURNS TABLE(tenant_id text, id text)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT d.tenant_id, d.id FROM plugin_deliveries d
    WHERE d.status = 'pending' AND d.next_attempt_at <= $1
    ORDER BY d.next_attempt_at, d.id LIMIT $2;
END $f$;

CREATE OR REPLACE FUNCTION keel_due_schedules(now_ms bigint, max_rows bigint)
  RETURNS TABLE(tenant_id text, id text)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT s.tenant_id, s.id FROM schedules s
    WHERE s.status = 'active' AND s.next_fire_at <= $1 ORDER BY s.next_fire_at, s.id LIMIT $2;
END $f$;

CREATE OR REPLACE FUNCTION keel_next_fire_at() RETURNS bigint
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
BEGIN
  RETURN (SELECT min(next_fire_at) FROM schedules WHERE status = 'active');
END $f$;

CREATE OR REPLACE FUNCTION keel_due_introspections(now_ms bigint, max_rows bigint)
  RETURNS TABLE(tenant_id text, session_id text, agent_id text, due_at bigint)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT i.tenant_id, i.session_id, i.agent_id, i.due_at FROM introspection_due i
    WHERE i.due_at <= $1 ORDER BY i.due_at, i.session_id LIMIT $2;
END $f$;

CREATE OR REPLACE FUNCTION keel_unhashed_tenants() RETURNS TABLE(tenant_id text)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT DISTINCT e.tenant_id FROM events e WHERE e.hash = '';
END $f$;
