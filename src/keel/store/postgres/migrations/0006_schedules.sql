-- Schedules (cron or one-shot) and the slots they fired: (schedule_id, slot) is unique,
-- so a slot is recorded once. schedules_due serves the runtime-wide due list and the
-- earliest next_fire_at.
CREATE TABLE schedules(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
  agent_id TEXT COLLATE "C" NOT NULL, name TEXT COLLATE "C" NOT NULL,
  kind TEXT COLLATE "C" NOT NULL, cron TEXT NOT NULL, at BIGINT, timezone TEXT NOT NULL,
  prompt TEXT NOT NULL, session_id TEXT COLLATE "C" NOT NULL, missed TEXT COLLATE "C" NOT NULL,
  status TEXT COLLATE "C" NOT NULL, next_fire_at BIGINT, last_fired_at BIGINT,
  created_by TEXT NOT NULL, caller_role TEXT NOT NULL, created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL);
CREATE INDEX schedules_tenant ON schedules(tenant_id, agent_id, id);
CREATE INDEX schedules_due ON schedules(status, next_fire_at);
CREATE TABLE schedule_fires(
  tenant_id TEXT COLLATE "C" NOT NULL,
  schedule_id TEXT COLLATE "C" NOT NULL REFERENCES schedules(id), slot BIGINT NOT NULL,
  fired_at BIGINT NOT NULL, outcome TEXT COLLATE "C" NOT NULL,
  session_id TEXT COLLATE "C" NOT NULL, run_id TEXT COLLATE "C" NOT NULL,
  message_id TEXT COLLATE "C" NOT NULL, error TEXT NOT NULL, PRIMARY KEY(schedule_id, slot));
ALTER TABLE schedules ENABLE ROW LEVEL SECURITY;
ALTER TABLE schedules FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON schedules
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE schedule_fires ENABLE ROW LEVEL SECURITY;
ALTER TABLE schedule_fires FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON schedule_fires
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
