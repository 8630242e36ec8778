-- Users (docs/USERS.md): the people of a tenant; the identities that say who they are on a chat
-- platform ((platform, platform_user_id) unique in a tenant); their roles on each agent; and
-- each agent's access level (an agent without a row is private; its access code, when set, is the
-- tenant secret keel.access-code.AGENT_ID). A token may belong to a user.
DO $$ BEGIN EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema()); END $$;
CREATE TABLE users(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
  name TEXT NOT NULL, merged_into TEXT COLLATE "C" NOT NULL, created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL);
CREATE UNIQUE INDEX users_tenant ON users(tenant_id, id);
CREATE INDEX users_merged ON users(tenant_id, merged_into);
CREATE TABLE identities(
  tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id), platform TEXT COLLATE "C" NOT NULL,
  platform_user_id TEXT COLLATE "C" NOT NULL, user_id TEXT COLLATE "C" NOT NULL,
  name TEXT NOT NULL, created_at BIGINT NOT NULL,
  PRIMARY KEY(tenant_id, platform, platform_user_id),
  FOREIGN KEY(tenant_id, user_id) REFERENCES users(tenant_id, id));
CREATE INDEX identities_user ON identities(tenant_id, user_id);
CREATE TABLE agent_members(
  tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id), agent_id TEXT COLLATE "C" NOT NULL,
  user_id TEXT COLLATE "C" NOT NULL, role TEXT COLLATE "C" NOT NULL,
  created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,
  PRIMARY KEY(tenant_id, agent_id, user_id),
  FOREIGN KEY(tenant_id, user_id) REFERENCES users(tenant_id, id));
CREATE INDEX agent_members_user ON agent_members(tenant_id, user_id, agent_id);
CREATE TABLE agent_access(
  tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id), agent_id TEXT COLLATE "C" NOT NULL,
  level TEXT COLLATE "C" NOT NULL, code_set BIGINT NOT NULL, updated_at BIGINT NOT NULL,
  PRIMARY KEY(tenant_id, agent_id));
ALTER TABLE users ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON users
  USING (tenant_id = current_setting('app.tenant_id', true))
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true));
ALTER TABLE identities ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON identities
  USING (tenant_id = current_setting('app.tenant_id', true))
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true));
ALTER TABLE agent_members ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON agent_members
  USING (tenant_id = current_setting('app.tenant_id', true))
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true));
ALTER TABLE agent_access ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON agent_access
  USING (tenant_id = current_setting('app.tenant_id', true))
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true));
ALTER TABLE api_tokens ADD COLUMN user_id TEXT COLLATE "C" NOT NULL DEFAULT '';
