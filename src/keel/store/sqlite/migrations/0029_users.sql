-- Users (docs/USERS.md): the people of a tenant; the identities that say who they are on a chat
-- platform ((platform, platform_user_id) unique in a tenant); their roles on each agent; and
-- each agent's access level (an agent without a row is private; its access code, when set, is the
-- tenant secret keel.access-code.AGENT_ID). A token may belong to a user.
CREATE TABLE users(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL REFERENCES tenants(id), name TEXT NOT NULL,
  merged_into TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL);
CREATE UNIQUE INDEX users_tenant ON users(tenant_id, id);
CREATE INDEX users_merged ON users(tenant_id, merged_into);
CREATE TABLE identities(
  tenant_id TEXT NOT NULL REFERENCES tenants(id), platform TEXT NOT NULL,
  platform_user_id TEXT NOT NULL, user_id TEXT NOT NULL, name TEXT NOT NULL,
  created_at INTEGER NOT NULL, PRIMARY KEY(tenant_id, platform, platform_user_id),
  FOREIGN KEY(tenant_id, user_id) REFERENCES users(tenant_id, id));
CREATE INDEX identities_user ON identities(tenant_id, user_id);
CREATE TABLE agent_members(
  tenant_id TEXT NOT NULL REFERENCES tenants(id), agent_id TEXT NOT NULL,
  user_id TEXT NOT NULL, role TEXT NOT NULL, created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL, PRIMARY KEY(tenant_id, agent_id, user_id),
  FOREIGN KEY(tenant_id, user_id) REFERENCES users(tenant_id, id));
CREATE INDEX agent_members_user ON agent_members(tenant_id, user_id, agent_id);
CREATE TABLE agent_access(
  tenant_id TEXT NOT NULL REFERENCES tenants(id), agent_id TEXT NOT NULL, level TEXT NOT NULL,
  code_set INTEGER NOT NULL, updated_at INTEGER NOT NULL, PRIMARY KEY(tenant_id, agent_id));
ALTER TABLE api_tokens ADD COLUMN user_id TEXT NOT NULL DEFAULT '';
