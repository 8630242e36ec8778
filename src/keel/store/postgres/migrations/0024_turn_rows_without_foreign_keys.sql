-- The rows a turn writes no longer check their parent on PostgreSQL (docs/decisions/0015).
-- Each check ran `SELECT ... FOR KEY SHARE` on the parent: a row lock that rewrites the
-- parent's tuple header and logs it, six times a turn, and on the tenant's row itself from
-- every node's transactions at once. The parents here are never deleted (tenants, sessions and
-- runs end by status), and a unit writes a child only for a parent it read or wrote itself, so
-- the checks never refused a row; pg_stat_statements and the writer backend's CPU measured
-- them at 12 to 20 % of it. SQLite keeps its foreign keys: its checks take no lock.
ALTER TABLE messages DROP CONSTRAINT messages_session_id_fkey;
ALTER TABLE runs DROP CONSTRAINT runs_session_id_fkey;
ALTER TABLE run_steps DROP CONSTRAINT run_steps_run_id_fkey;
ALTER TABLE tool_calls DROP CONSTRAINT tool_calls_run_id_fkey;
ALTER TABLE model_usage DROP CONSTRAINT model_usage_tenant_id_fkey;
ALTER TABLE model_cache DROP CONSTRAINT model_cache_tenant_id_fkey;
ALTER TABLE usage_totals DROP CONSTRAINT usage_totals_tenant_id_fkey;
ALTER TABLE compactions DROP CONSTRAINT compactions_tenant_id_fkey;
ALTER TABLE compactions DROP CONSTRAINT compactions_session_id_fkey;
