-- Approvals in chat (docs/CHANNELS.md), and guests' allowances (docs/USERS.md): a direct conversation records whose it is (its
-- contact: the platform's id of the person), so that a card reaches an approver where they
-- talk to the bot; the outbox carries approval cards beside answers (approval_id set; user_id
-- the approver it goes to, or for an answer the person who asked; message the platform's
-- reference to a card once shown, to edit it when decided). A card is "shown" while its
-- approval waits. The leader finds the approvals of channel runs that have no card yet through
-- keel_approvals_to_card, and cards to close through keel_due_replies: keys and nothing else.
DO $$ BEGIN EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema()); END $$;
ALTER TABLE channel_conversations ADD COLUMN contact TEXT COLLATE "C" NOT NULL DEFAULT '';
CREATE INDEX channel_conversations_contact ON channel_conversations(tenant_id, channel_id, contact)
  WHERE contact <> '';
ALTER TABLE channel_replies ADD COLUMN approval_id TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE channel_replies ADD COLUMN user_id TEXT COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE channel_replies ADD COLUMN message TEXT NOT NULL DEFAULT '';
CREATE INDEX channel_replies_approval ON channel_replies(tenant_id, approval_id)
  WHERE approval_id <> '';
CREATE INDEX channel_replies_run ON channel_replies(tenant_id, run_id);
CREATE INDEX approvals_run ON approvals(tenant_id, run_id);
-- A guest's daily allowance of model tokens on an agent (docs/USERS.md), counted over the runs
-- that answered their messages.
ALTER TABLE agent_access ADD COLUMN guest_daily_tokens BIGINT NOT NULL DEFAULT 200000;
CREATE INDEX channel_replies_user ON channel_replies(tenant_id, user_id, created_at)
  WHERE user_id <> '';
DROP INDEX channel_replies_due;
CREATE INDEX channel_replies_due ON channel_replies(status, next_attempt_at)
  WHERE status IN ('waiting', 'pending', 'sending', 'shown');
CREATE OR REPLACE FUNCTION keel_due_replies(now_ms bigint, node text, max_rows bigint)
  RETURNS TABLE(tenant_id text, id text)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT o.tenant_id, o.id FROM channel_replies o
    WHERE o.status IN ('waiting', 'pending', 'sending', 'shown') AND (
      (o.status = 'pending' AND o.next_attempt_at <= $1) OR
      (o.status = 'sending' AND (o.next_attempt_at <= $1 OR o.origin = $2)) OR
      (o.status = 'waiting' AND EXISTS (SELECT 1 FROM runs r WHERE r.tenant_id = o.tenant_id
         AND r.id = o.run_id AND r.status IN ('done', 'failed', 'cancelled'))) OR
      (o.status = 'shown' AND EXISTS (SELECT 1 FROM approvals a WHERE a.tenant_id = o.tenant_id
         AND a.id = o.approval_id AND a.status <> 'pending')))
    ORDER BY o.next_attempt_at, o.id LIMIT $3;
END $f$;
REVOKE ALL ON FUNCTION keel_due_replies(bigint, text, bigint) FROM PUBLIC;
CREATE FUNCTION keel_approvals_to_card(max_rows bigint)
  RETURNS TABLE(tenant_id text, id text)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS $f$
#variable_conflict use_column
BEGIN
  RETURN QUERY SELECT a.tenant_id, a.id FROM channel_replies o
    JOIN approvals a ON a.tenant_id = o.tenant_id AND a.run_id = o.run_id
    WHERE o.status = 'waiting' AND o.approval_id = '' AND a.status = 'pending'
      AND NOT EXISTS (SELECT 1 FROM channel_replies c WHERE c.tenant_id = a.tenant_id
        AND c.approval_id = a.id)
    ORDER BY a.created_at, a.id LIMIT $1;
END $f$;
REVOKE ALL ON FUNCTION keel_approvals_to_card(bigint) FROM PUBLIC;
