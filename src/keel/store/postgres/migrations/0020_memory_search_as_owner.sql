-- Memory search without a superuser (docs/MEMORY.md, section 8). Under row-level security
-- PostgreSQL lets an index serve only conditions whose functions are LEAKPROOF, and the text
-- match (@@, ts_match_vq) is not: a search made as the runtime role read every memory of its
-- agent instead of the GIN index, unless a superuser marked ts_match_vq LEAKPROOF. This
-- function makes the search as the owner, whom row-level security does not bind (the tables do
-- not FORCE it, 0015), and keeps tenants apart itself, as the policies do: it reads only the
-- tenant that the caller's transaction is bound to (app.tenant_id, the setting every policy
-- checks), so it shows its caller no row a policy would hide. EXECUTE plans the query with its
-- values each time: whether the GIN index or the agent's newest rows (memories_seq_order,
-- read backwards) find the candidates sooner depends on how common the words are, which the
-- planner knows from the statistics. Its work_mem keeps the newest 2,000 candidates (a top-N
-- sort of whole rows, some 4 MB) in memory rather than on disk. EXECUTE goes to the runtime
-- role alone (MigrateStore).
DO $$ BEGIN EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema()); END $$;
CREATE FUNCTION keel_search_memories(agent text, query text, rank_query text, tag text,
                                     candidates bigint, max_rows bigint)
  RETURNS TABLE(id text, tenant_id text, agent_id text, text text, tags text, source text,
                created_at bigint, updated_at bigint, score real)
  LANGUAGE plpgsql STABLE SECURITY DEFINER SET search_path FROM CURRENT SET work_mem = '16MB'
  AS $f$
BEGIN
  RETURN QUERY EXECUTE $q$
    SELECT c.id, c.tenant_id, c.agent_id, c.text, c.tags, c.source, c.created_at,
           c.updated_at, ts_rank(c.tsv, to_tsquery('simple', $3), 1) AS score
    FROM (SELECT m.* FROM memories AS m, to_tsquery('simple', $2) AS q
          WHERE m.tenant_id = current_setting('app.tenant_id', true) AND m.agent_id = $1
            AND m.tsv @@ q AND ($4 = '' OR m.tags::jsonb ? $4)
          ORDER BY m.seq DESC LIMIT $5) AS c
    ORDER BY score DESC, c.updated_at DESC, c.id LIMIT $6 $q$
  USING agent, query, rank_query, tag, candidates, max_rows;
END
$f$;
REVOKE ALL ON FUNCTION keel_search_memories(text, text, text, text, bigint, bigint) FROM PUBLIC;
