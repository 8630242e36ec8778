-- A session's own instructions, given when it is opened (the system messages of a Chat
-- Completions conversation that opened it): the context puts them after the agent's.
ALTER TABLE sessions ADD COLUMN instructions TEXT NOT NULL DEFAULT '';
