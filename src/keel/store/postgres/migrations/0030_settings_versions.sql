-- Each tenant's settings version: a number that changes whenever a row a turn reads of its
-- tenant's or agent's settings changes (emergency stops, working memories, skills and their
-- assignments, plugins and theirs). A node keeps those rows between turns and reads this
-- number instead (runtime/settings_cache.h); triggers keep it, so no write can forget to. Writes
-- of one tenant are serial (its write lock, decisions/0014), so the upsert never races.
DO $$ BEGIN EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema()); END $$;
CREATE TABLE settings_versions(
  tenant_id TEXT COLLATE "C" PRIMARY KEY, version BIGINT NOT NULL);
ALTER TABLE settings_versions ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON settings_versions
  USING (tenant_id = current_setting('app.tenant_id', true))
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true));
-- Runs as the role that wrote the row: the runtime role writes a tenant's rows bound to that
-- tenant, which the policy above lets it count for.
CREATE FUNCTION keel_bump_settings() RETURNS trigger
  LANGUAGE plpgsql SET search_path FROM CURRENT
  AS $f$
DECLARE tenant text := CASE WHEN TG_OP = 'DELETE' THEN OLD.tenant_id ELSE NEW.tenant_id END;
BEGIN
  INSERT INTO settings_versions AS v(tenant_id, version) VALUES (tenant, 1)
    ON CONFLICT (tenant_id) DO UPDATE SET version = v.version + 1;
  RETURN NULL;
END $f$;
REVOKE ALL ON FUNCTION keel_bump_settings() FROM PUBLIC;
CREATE TRIGGER emergency_stops_settings AFTER INSERT OR UPDATE OR DELETE ON emergency_stops
  FOR EACH ROW EXECUTE FUNCTION keel_bump_settings();
CREATE TRIGGER working_memories_settings AFTER INSERT OR UPDATE OR DELETE ON working_memories
  FOR EACH ROW EXECUTE FUNCTION keel_bump_settings();
CREATE TRIGGER skills_settings AFTER INSERT OR UPDATE OR DELETE ON skills
  FOR EACH ROW EXECUTE FUNCTION keel_bump_settings();
CREATE TRIGGER agent_skills_settings AFTER INSERT OR UPDATE OR DELETE ON agent_skills
  FOR EACH ROW EXECUTE FUNCTION keel_bump_settings();
CREATE TRIGGER plugins_settings AFTER INSERT OR UPDATE OR DELETE ON plugins
  FOR EACH ROW EXECUTE FUNCTION keel_bump_settings();
CREATE TRIGGER agent_plugins_settings AFTER INSERT OR UPDATE OR DELETE ON agent_plugins
  FOR EACH ROW EXECUTE FUNCTION keel_bump_settings();
