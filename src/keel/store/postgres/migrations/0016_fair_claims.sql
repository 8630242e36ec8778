-- Claimable runs by turns of tenants (every tenant's oldest, then every tenant's second,
-- ...), so that one tenant's long queue cannot fill the dispatcher's page and hide the
-- others' runs. CREATE OR REPLACE keeps the function's owner and rights.
DO $$
BEGIN
  EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema());
END $$;
CREATE OR REPLACE FUNCTION keel_claimable_runs(now_ms bigint, max_rows bigint)
  RETURNS TABLE(tenant_id text, id text)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS 'SELECT tenant_id, id FROM (
        SELECT tenant_id, id, row_number() OVER (PARTITION BY tenant_id ORDER BY id) AS turn
        FROM (
          SELECT r.tenant_id, r.id FROM runs r WHERE r.status = ''queued''
            AND NOT EXISTS (SELECT 1 FROM runs p WHERE p.session_id = r.session_id
              AND p.status IN (''queued'', ''running'', ''waiting_for_approval'') AND p.id < r.id)
          UNION ALL
          SELECT tenant_id, id FROM runs WHERE status = ''running'' AND lease_expires_at < $1
        ) claimable
      ) turns ORDER BY turn, id LIMIT $2';
