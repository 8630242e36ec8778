-- The cluster's leadership as a lease (docs/decisions/0013-postgres-leadership-lease.md). It
-- was a session advisory lock on the leader's listener connection, which a stopped process (a
-- SIGSTOP, a paused VM, a partition that leaves the socket open) keeps for good, and with it
-- the schedules. Now the leader renews a row's expiry, read from the server's clock, and a
-- node takes the row once it has expired; a stopped leader loses it when its lease runs out.
-- The table holds no tenant's data; row-level security with no policy keeps the runtime role
-- out of it but through these two functions.
DO $$ BEGIN EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema()); END $$;
CREATE TABLE leadership(
  id INTEGER PRIMARY KEY CHECK (id = 1), origin TEXT COLLATE "C" NOT NULL,
  expires_at BIGINT NOT NULL);
ALTER TABLE leadership ENABLE ROW LEVEL SECURITY;
-- Takes or renews the lease for `origin` for `ttl_ms` from now: the expiry (milliseconds since
-- the epoch, by the server's clock) when `origin` holds it, no row when another node does.
CREATE FUNCTION keel_lead(origin text, ttl_ms bigint) RETURNS bigint
  LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
    INSERT INTO leadership AS l(id, origin, expires_at)
    VALUES (1, $1, (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $2)
    ON CONFLICT (id) DO UPDATE SET origin = EXCLUDED.origin, expires_at = EXCLUDED.expires_at
      WHERE l.origin = EXCLUDED.origin
         OR l.expires_at < (extract(epoch FROM clock_timestamp()) * 1000)::bigint
    RETURNING expires_at $f$;
-- Gives the lease up at once (a node that stops), so that another takes it at its next try.
CREATE FUNCTION keel_resign(origin text) RETURNS void
  LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT
  AS 'UPDATE leadership SET expires_at = 0 WHERE origin = $1';
REVOKE ALL ON FUNCTION keel_lead(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION keel_resign(text) FROM PUBLIC;
