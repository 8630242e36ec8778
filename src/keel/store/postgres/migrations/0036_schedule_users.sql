-- The person a schedule was made for beside its token: the sender of the chat message whose run
-- created it (a channel's runs act through its creator's token), or the one a slot's run that
-- created it acted for. Their role on the agent at each slot bounds the slot's, as the token's
-- user's does; '' for none.
ALTER TABLE schedules ADD COLUMN user_id text COLLATE "C" NOT NULL DEFAULT '';
