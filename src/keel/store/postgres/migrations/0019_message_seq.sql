-- A message's place in its session in commit order, so that a node that keeps a
-- session's conversation between turns reads only the messages committed since (ids,
-- made by clocks, do not follow commit order). Existing messages are numbered by id; the
-- owner numbers every tenant's, so row security is lifted for the update.
ALTER TABLE messages ADD COLUMN seq BIGINT NOT NULL DEFAULT 0;
ALTER TABLE messages NO FORCE ROW LEVEL SECURITY;
UPDATE messages m SET seq = n.seq
  FROM (SELECT id, row_number() OVER (PARTITION BY session_id ORDER BY id) AS seq
        FROM messages) n
  WHERE m.id = n.id;
ALTER TABLE messages FORCE ROW LEVEL SECURITY;
CREATE UNIQUE INDEX messages_seq ON messages(session_id, seq);
