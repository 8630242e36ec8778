-- Whom a run acts for beside its token (the user and channel of the chat message it answers,
-- a webhook's channel, a slot's schedule's): what the run makes, such as a schedule, stays
-- bounded by them, however the records that led to the run change meanwhile; '' for none.
-- The runs still to finish take theirs from their chat reply or their slot; finished runs
-- make nothing more and keep ''.
ALTER TABLE runs ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN channel_id TEXT NOT NULL DEFAULT '';
UPDATE runs SET (user_id, channel_id) =
  (SELECT r.user_id, r.channel_id FROM channel_replies r
   WHERE r.tenant_id = runs.tenant_id AND r.run_id = runs.id AND r.approval_id = ''
   ORDER BY r.id LIMIT 1)
  WHERE status IN ('queued', 'running', 'waiting_for_approval') AND EXISTS
    (SELECT 1 FROM channel_replies r
     WHERE r.tenant_id = runs.tenant_id AND r.run_id = runs.id AND r.approval_id = '');
UPDATE runs SET (user_id, channel_id) =
  (SELECT s.user_id, s.channel_id FROM schedule_fires f JOIN schedules s ON s.id = f.schedule_id
   WHERE f.tenant_id = runs.tenant_id AND f.run_id = runs.id LIMIT 1)
  WHERE status IN ('queued', 'running', 'waiting_for_approval') AND user_id = ''
    AND channel_id = '' AND EXISTS
    (SELECT 1 FROM schedule_fires f JOIN schedules s ON s.id = f.schedule_id
     WHERE f.tenant_id = runs.tenant_id AND f.run_id = runs.id);
