-- A tenant's unfinished runs (intake's count) and the dispatcher's claimable runs through
-- indexes of those alone, as PostgreSQL's 0022 has them: the indexes of every run by
-- (tenant, status) and (status, lease expiry) gained an entry each time a run finished, two
-- b-tree inserts per turn whose entries nothing reads. The queries repeat the WHERE term word
-- for word and name the index, so that SQLite uses it.
DROP INDEX runs_tenant_status;
CREATE INDEX runs_tenant_active ON runs(tenant_id, status) WHERE status IN ('queued','running');
DROP INDEX runs_claimable;
CREATE INDEX runs_claimable ON runs(status, lease_expires_at) WHERE status IN ('queued','running');
