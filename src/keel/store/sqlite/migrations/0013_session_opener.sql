-- Who opened a session: guests reach only their own.
ALTER TABLE sessions ADD COLUMN created_by TEXT NOT NULL DEFAULT '';
