-- runs_session_active's WHERE term was an IN list of three statuses. SQLite evaluates an IN
-- list of more than two constants through a temporary b-tree it builds and drops each time:
-- every insert and update of a run did so once or twice to decide whether the run belongs in
-- the index, and each query driving the index's status key by the list once more (eight such
-- b-trees a turn, a tenth of the instructions of a turn's reads and writes). The same term as
-- ORs needs none. The status leaves the key: a query's copy of the term would otherwise be
-- turned back into an IN list that drives it. A session has few unfinished runs, and the
-- queries read their rows.
DROP INDEX runs_session_active;
CREATE INDEX runs_session_active ON runs(session_id, tenant_id)
  WHERE status='queued' OR status='running' OR status='waiting_for_approval';
