-- Each tenant's settings version: a number that changes whenever a row a turn reads of its
-- tenant's or agent's settings changes (emergency stops, working memories, skills and their
-- assignments, plugins and theirs). A node keeps those rows between turns and reads this
-- number instead (runtime/settings_cache.h); triggers keep it, so no write can forget to.
CREATE TABLE settings_versions(
  tenant_id TEXT NOT NULL PRIMARY KEY, version INTEGER NOT NULL) WITHOUT ROWID;
CREATE TRIGGER emergency_stops_settings_insert AFTER INSERT ON emergency_stops BEGIN
  INSERT INTO settings_versions VALUES(NEW.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER emergency_stops_settings_update AFTER UPDATE ON emergency_stops BEGIN
  INSERT INTO settings_versions VALUES(NEW.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER emergency_stops_settings_delete AFTER DELETE ON emergency_stops BEGIN
  INSERT INTO settings_versions VALUES(OLD.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER working_memories_settings_insert AFTER INSERT ON working_memories BEGIN
  INSERT INTO settings_versions VALUES(NEW.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER working_memories_settings_update AFTER UPDATE ON working_memories BEGIN
  INSERT INTO settings_versions VALUES(NEW.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER working_memories_settings_delete AFTER DELETE ON working_memories BEGIN
  INSERT INTO settings_versions VALUES(OLD.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER skills_settings_insert AFTER INSERT ON skills BEGIN
  INSERT INTO settings_versions VALUES(NEW.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER skills_settings_update AFTER UPDATE ON skills BEGIN
  INSERT INTO settings_versions VALUES(NEW.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER skills_settings_delete AFTER DELETE ON skills BEGIN
  INSERT INTO settings_versions VALUES(OLD.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER agent_skills_settings_insert AFTER INSERT ON agent_skills BEGIN
  INSERT INTO settings_versions VALUES(NEW.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER agent_skills_settings_update AFTER UPDATE ON agent_skills BEGIN
  INSERT INTO settings_versions VALUES(NEW.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER agent_skills_settings_delete AFTER DELETE ON agent_skills BEGIN
  INSERT INTO settings_versions VALUES(OLD.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER plugins_settings_insert AFTER INSERT ON plugins BEGIN
  INSERT INTO settings_versions VALUES(NEW.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER plugins_settings_update AFTER UPDATE ON plugins BEGIN
  INSERT INTO settings_versions VALUES(NEW.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER plugins_settings_delete AFTER DELETE ON plugins BEGIN
  INSERT INTO settings_versions VALUES(OLD.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER agent_plugins_settings_insert AFTER INSERT ON agent_plugins BEGIN
  INSERT INTO settings_versions VALUES(NEW.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER agent_plugins_settings_update AFTER UPDATE ON agent_plugins BEGIN
  INSERT INTO settings_versions VALUES(NEW.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
CREATE TRIGGER agent_plugins_settings_delete AFTER DELETE ON agent_plugins BEGIN
  INSERT INTO settings_versions VALUES(OLD.tenant_id, 1)
    ON CONFLICT(tenant_id) DO UPDATE SET version=version+1;
END;
