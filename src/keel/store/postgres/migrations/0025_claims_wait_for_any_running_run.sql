-- A queued run is claimable when its session has no running or waiting run, whatever that run's
-- id, and no queued run before it. It waited only for the session's unfinished runs with an
-- earlier id, but a message posted at the same moment as another may get the earlier id and be
-- queued behind the other's run, which intake claimed: the dispatcher then ran both at once.
DO $$
BEGIN
  EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema());
END $$;

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
            AND p.status IN ('queued', 'running', 'waiting_for_approval') AND p.id <> r.id
            AND (p.status <> 'queued' OR p.id < r.id))
        UNION ALL
        SELECT r.tenant_id, r.id FROM runs r WHERE r.status = 'running' AND r.lease_expires_at < $1
      ) c
    ) turns ORDER BY turns.turn, turns.id LIMIT $2;
END $f$;
