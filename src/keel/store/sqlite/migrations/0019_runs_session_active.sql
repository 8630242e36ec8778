-- A session's unfinished runs (SessionBusy, ClaimableRuns) through an index of those
-- alone: an index of every run by (session, status) took a page of its own per session
-- that a turn touched, about a seventh of the pages each commit wrote at 64 sessions;
-- this one stays a few pages, which every commit shares. The queries repeat its WHERE
-- term word for word, so that SQLite sees they imply it.
DROP INDEX runs_session_status;
CREATE INDEX runs_session_active ON runs(session_id, status)
  WHERE status IN ('queued','running','waiting_for_approval');
