-- The dispatcher's look for claimable runs: a running run whose lease ran out is one
-- probe of this index, not a look at every running run's row.
DROP INDEX runs_status;
CREATE INDEX runs_claimable ON runs(status, lease_expires_at);
