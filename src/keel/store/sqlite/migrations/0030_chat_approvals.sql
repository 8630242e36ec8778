-- Approvals in chat (docs/CHANNELS.md), and guests' allowances (docs/USERS.md): a direct conversation records whose it is (its
-- contact: the platform's id of the person), so that a card reaches an approver where they
-- talk to the bot; the outbox carries approval cards beside answers (approval_id set; user_id
-- the approver it goes to, or for an answer the person who asked; message the platform's
-- reference to a card once shown, to edit it when decided). A card is "shown" while its
-- approval waits.
ALTER TABLE channel_conversations ADD COLUMN contact TEXT NOT NULL DEFAULT '';
CREATE INDEX channel_conversations_contact ON channel_conversations(tenant_id, channel_id, contact)
  WHERE contact <> '';
ALTER TABLE channel_replies ADD COLUMN approval_id TEXT NOT NULL DEFAULT '';
ALTER TABLE channel_replies ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
ALTER TABLE channel_replies ADD COLUMN message TEXT NOT NULL DEFAULT '';
CREATE INDEX channel_replies_approval ON channel_replies(tenant_id, approval_id)
  WHERE approval_id <> '';
CREATE INDEX channel_replies_run ON channel_replies(tenant_id, run_id);
CREATE INDEX approvals_run ON approvals(tenant_id, run_id);
-- A guest's daily allowance of model tokens on an agent (docs/USERS.md), counted over the runs
-- that answered their messages.
ALTER TABLE agent_access ADD COLUMN guest_daily_tokens INTEGER NOT NULL DEFAULT 200000;
CREATE INDEX channel_replies_user ON channel_replies(tenant_id, user_id, created_at)
  WHERE user_id <> '';
