-- Skills registered per tenant (their files as one JSON object), and the agents they are
-- assigned to; assignments go with their skill.
CREATE TABLE skills(
  tenant_id TEXT NOT NULL REFERENCES tenants(id), name TEXT NOT NULL, description TEXT NOT NULL,
  hash TEXT NOT NULL, bytes INTEGER NOT NULL, manifest TEXT NOT NULL, created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL, files TEXT NOT NULL, PRIMARY KEY(tenant_id, name));
CREATE TABLE agent_skills(
  tenant_id TEXT NOT NULL, agent_id TEXT NOT NULL, skill TEXT NOT NULL,
  created_at INTEGER NOT NULL, PRIMARY KEY(tenant_id, agent_id, skill),
  FOREIGN KEY(tenant_id, skill) REFERENCES skills(tenant_id, name) ON DELETE CASCADE);
CREATE INDEX agent_skills_skill ON agent_skills(tenant_id, skill);
