-- The fleet as its nodes report it (GET /v1/nodes): each node upserts its row once a second
-- with the leadership lease, and the platform admin's view reads the rows seen lately, with the
-- leader and the cluster's queued runs. Like `leadership`, the table holds no tenant's data and
-- row-level security with no policy keeps the runtime role out of it but through these
-- functions; counting queued runs crosses tenants, so it is one of them too.
DO $$ BEGIN EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema()); END $$;
CREATE TABLE nodes(
  origin TEXT COLLATE "C" PRIMARY KEY, address TEXT COLLATE "C" NOT NULL,
  started_at BIGINT NOT NULL, seen_at BIGINT NOT NULL, runs_executing BIGINT NOT NULL,
  runs_finished BIGINT NOT NULL);
ALTER TABLE nodes ENABLE ROW LEVEL SECURITY;
-- Records a node's report; seen_at is the server's clock, so that nodes' clocks do not matter.
-- The rows of nodes gone for an hour are deleted on the way.
CREATE FUNCTION keel_node_report(origin text, address text, started_at bigint,
                                 runs_executing bigint, runs_finished bigint) RETURNS void
  LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
    DELETE FROM nodes
      WHERE seen_at < (extract(epoch FROM clock_timestamp()) * 1000)::bigint - 3600000;
    INSERT INTO nodes AS n(origin, address, started_at, seen_at, runs_executing, runs_finished)
    VALUES ($1, $2, $3, (extract(epoch FROM clock_timestamp()) * 1000)::bigint, $4, $5)
    ON CONFLICT (origin) DO UPDATE SET address = EXCLUDED.address,
      started_at = EXCLUDED.started_at, seen_at = EXCLUDED.seen_at,
      runs_executing = EXCLUDED.runs_executing, runs_finished = EXCLUDED.runs_finished $f$;
-- The nodes seen within `within_ms`, each with whether it holds the leadership lease now.
CREATE FUNCTION keel_nodes(within_ms bigint)
  RETURNS TABLE(origin text, address text, started_at bigint, seen_at bigint,
                runs_executing bigint, runs_finished bigint, leader boolean)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
DECLARE now_ms bigint := (extract(epoch FROM clock_timestamp()) * 1000)::bigint;
BEGIN
  RETURN QUERY
    SELECT n.origin::text, n.address::text, n.started_at, n.seen_at, n.runs_executing,
           n.runs_finished,
           EXISTS (SELECT 1 FROM leadership l WHERE l.origin = n.origin AND l.expires_at > now_ms)
    FROM nodes n WHERE n.seen_at >= now_ms - within_ms ORDER BY n.origin;
END $f$;
CREATE FUNCTION keel_queued_runs() RETURNS bigint
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$ BEGIN RETURN (SELECT count(*) FROM runs WHERE status = 'queued'); END $f$;
REVOKE ALL ON FUNCTION keel_node_report(text, text, bigint, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION keel_nodes(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION keel_queued_runs() FROM PUBLIC;
