-- A message's place in its session in commit order, so that a node that keeps a
-- session's conversation between turns reads only the messages committed since (ids,
-- made by clocks, do not follow commit order). Existing messages are numbered by id.
ALTER TABLE messages ADD COLUMN seq INTEGER NOT NULL DEFAULT 0;
UPDATE messages SET seq = n.seq
  FROM (SELECT id, row_number() OVER (PARTITION BY session_id ORDER BY id) AS seq
        FROM messages) AS n
  WHERE messages.id = n.id;
CREATE UNIQUE INDEX messages_seq ON messages(session_id, seq);
