-- Whom a run acts for beside its token (the user and channel of the chat message it answers,
-- a webhook's channel, a slot's schedule's): what the run makes, such as a schedule, stays
-- bounded by them, however the records that led to the run change meanwhile; '' for none.
-- The runs still to finish take theirs from their chat reply or their slot (the schema's
-- owner sees every tenant's rows); finished runs make nothing more and keep ''.
ALTER TABLE runs ADD COLUMN user_id text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN channel_id text COLLATE "C" NOT NULL DEFAULT '';
UPDATE runs SET user_id = r.user_id, channel_id = r.channel_id
  FROM (SELECT DISTINCT ON (tenant_id, run_id) tenant_id, run_id, user_id, channel_id
        FROM channel_replies WHERE approval_id = '' ORDER BY tenant_id, run_id, id) r
  WHERE r.tenant_id = runs.tenant_id AND r.run_id = runs.id
    AND runs.status IN ('queued', 'running', 'waiting_for_approval');
UPDATE runs SET user_id = s.user_id, channel_id = s.channel_id
  FROM schedule_fires f JOIN schedules s ON s.id = f.schedule_id
  WHERE f.tenant_id = runs.tenant_id AND f.run_id = runs.id
    AND runs.status IN ('queued', 'running', 'waiting_for_approval')
    AND runs.user_id = '' AND runs.channel_id = '';
