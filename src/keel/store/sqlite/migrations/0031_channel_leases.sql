-- A lease per polled channel (docs/CHANNELS.md): the node that polls a channel (or registers
-- its command) holds its row until `held_until` and renews it; another node takes a channel
-- whose lease ran out, so a stopped or dead node's channels move on, and the nodes of a fleet
-- share the channels between them. One node at a time polls a bot (Telegram answers a second
-- poller 409).
ALTER TABLE channel_polls ADD COLUMN holder TEXT NOT NULL DEFAULT '';
ALTER TABLE channel_polls ADD COLUMN held_until INTEGER NOT NULL DEFAULT 0;
