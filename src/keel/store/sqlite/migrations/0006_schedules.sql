-- Schedules (cron or one-shot) and the slots they fired: (schedule_id, slot) is unique,
-- so a slot is recorded once. schedules_due serves the runtime-wide due list and the
-- earliest next_fire_at.
CREATE TABLE schedules(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL REFERENCES tenants(id), agent_id TEXT NOT NULL,
  name TEXT NOT NULL, kind TEXT NOT NULL, cron TEXT NOT NULL, at INTEGER,
  timezone TEXT NOT NULL, prompt TEXT NOT NULL, session_id TEXT NOT NULL, missed TEXT NOT NULL,
  status TEXT NOT NULL, next_fire_at INTEGER, last_fired_at INTEGER, created_by TEXT NOT NULL,
  caller_role TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);
CREATE INDEX schedules_tenant ON schedules(tenant_id, agent_id, id);
CREATE INDEX schedules_due ON schedules(status, next_fire_at);
CREATE TABLE schedule_fires(
  tenant_id TEXT NOT NULL, schedule_id TEXT NOT NULL REFERENCES schedules(id), slot INTEGER NOT NULL,
  fired_at INTEGER NOT NULL, outcome TEXT NOT NULL, session_id TEXT NOT NULL,
  run_id TEXT NOT NULL, message_id TEXT NOT NULL, error TEXT NOT NULL,
  PRIMARY KEY(schedule_id, slot));
