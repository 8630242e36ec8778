-- A session's messages are read in seq order only (listing, context, introspection), through
-- messages_seq: the index by id within a session cost every message insert a page of its own.
DROP INDEX messages_session;
