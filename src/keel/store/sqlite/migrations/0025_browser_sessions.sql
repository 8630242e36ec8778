-- A dashboard sign-in is a token of its own, held in an HttpOnly cookie: parent_id names the token
-- that signed in (the one it acts as; revoking that revokes it), expires_at ends it.
ALTER TABLE api_tokens ADD COLUMN parent_id TEXT NOT NULL DEFAULT '';
ALTER TABLE api_tokens ADD COLUMN expires_at INTEGER;
