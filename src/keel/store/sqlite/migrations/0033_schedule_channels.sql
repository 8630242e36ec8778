-- The channel whose chat message's run created a schedule (a channel's runs act with its
-- `role`): that role, as it is at each slot, bounds the slot's, so that lowering a channel's
-- role lowers the schedules made through it too; '' for none.
ALTER TABLE schedules ADD COLUMN channel_id TEXT NOT NULL DEFAULT '';
