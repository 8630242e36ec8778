-- Unfinished runs through indexes of those alone, as SQLite's 0018 and 0019 have them. The
-- indexes of every run by (session, status), (status, id) and (tenant, status) keep an entry for
-- every status a run ever had (the dead ones until a vacuum): the checks of each turn (intake's
-- SessionBusy, the tenant's count of unfinished runs, the dispatcher's claimable runs) read them,
-- so that a turn read about 2.5 index entries and heap rows per run the tenant had ever run
-- (pg_stat_user_indexes: 10 million over 2,000 turns on runs_tenant_status). These hold the
-- unfinished runs alone, which stay few. The queries repeat their WHERE terms, so that the
-- planner sees they imply them.
DROP INDEX runs_session_status;
CREATE INDEX runs_session_active ON runs(session_id, status)
  WHERE status IN ('queued','running','waiting_for_approval');
DROP INDEX runs_status;
CREATE INDEX runs_claimable ON runs(status, lease_expires_at) WHERE status IN ('queued','running');
DROP INDEX runs_tenant_status;
CREATE INDEX runs_tenant_active ON runs(tenant_id, status) WHERE status IN ('queued','running');
