-- Skills registered per tenant (their files as one JSON object), and the agents they are
-- assigned to; assignments go with their skill.
CREATE TABLE skills(
  tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id), name TEXT COLLATE "C" NOT NULL,
  description TEXT NOT NULL, hash TEXT COLLATE "C" NOT NULL, bytes BIGINT NOT NULL,
  manifest TEXT NOT NULL, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,
  files TEXT NOT NULL, PRIMARY KEY(tenant_id, name));
CREATE TABLE agent_skills(
  tenant_id TEXT COLLATE "C" NOT NULL, agent_id TEXT COLLATE "C" NOT NULL,
  skill TEXT COLLATE "C" NOT NULL, created_at BIGINT NOT NULL,
  PRIMARY KEY(tenant_id, agent_id, skill),
  FOREIGN KEY(tenant_id, skill) REFERENCES skills(tenant_id, name) ON DELETE CASCADE);
CREATE INDEX agent_skills_skill ON agent_skills(tenant_id, skill);
ALTER TABLE skills ENABLE ROW LEVEL SECURITY;
ALTER TABLE skills FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON skills
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE agent_skills ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_skills FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON agent_skills
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
